"""Any Hugging Face model folder: a third architecture (GPT-2: other layer names, learned
positions, a short context, a tokenizer without a chat template) through ``entrogym train`` and
``entrogym eval``, with each mismatch named in one line before the model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vowel_env import TINY_SETTINGS  # registers test/Vowel-v0

from entrogym.commands.eval import cli as eval_cli
from entrogym.commands.train import cli as train_cli
from entrogym.models import model_limits, prepare_model
from entrogym.train.folder.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = str(ROOT / "examples" / "chat_templates" / "plain.jinja")
assert TINY_SETTINGS["engine"] == "hf"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    """A 2-layer random GPT-2 (context 256) with the SmolLM2 tokenizer minus its template."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, GPT2Config

    from entrogym.models import smollm2_tokenizer

    folder = tmp_path_factory.mktemp("models") / "tiny-gpt2"
    tokenizer = smollm2_tokenizer()
    tokenizer.chat_template = None
    eos = tokenizer.eos_token_id
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=256, n_embd=64, n_layer=2,
                        n_head=2, bos_token_id=eos, eos_token_id=eos)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    GenerationConfig(eos_token_id=eos, pad_token_id=eos).save_pretrained(folder)
    return folder


def _train(model: Path, out: Path, *extra: str) -> list[str]:
    return ["--env", "vowel_env:test/Vowel-v0", "--model", str(model), "--engine", "hf",
            "--engine-dtype", "fp32", "--iterations", "2", "--tasks-per-iter", "2",
            "--samples", "2", "--early-stop-min-per-task", "2", "--max-response-tokens", "6",
            "--max-context-tokens", "128", "--on-turn-budget", "step", "--threads", "1",
            "--out", str(out), *extra]  # fmt: skip


def test_limits_come_from_the_models_config(gpt2: Path) -> None:
    limits = model_limits(gpt2)
    assert limits.context == 256 and limits.eos_token_ids == (2,) and limits.pad_token_id == 2
    qwen = model_limits(prepare_model("tiny-random-qwen3"))
    assert qwen.context == 8192 and qwen.eos_token_ids == (2,)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ((), "has no chat template; pass one with --chat-template FILE"),
        (("--chat-template", TEMPLATE), "LoRA target module(s) ['q_proj'"),
        (
            (
                "--chat-template",
                TEMPLATE,
                "--lora-target-modules",
                "c_attn",
                "--max-context-tokens",
                "512",
                "--max-response-tokens",
                "8",
            ),
            "exceeds the context length of",
        ),  # fmt: skip
        (("--chat-template", "no/such.jinja"), "chat_template 'no/such.jinja' is not a file"),
    ],
)
def test_a_mismatch_is_one_line_before_the_model_loads(
    gpt2: Path, extra: tuple, message: str, tmp_path: Path, capsys
) -> None:
    assert train_cli(_train(gpt2, tmp_path / "run", *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()  # refused before the run folder or the model
    if "LoRA" in message:
        assert "c_attn" in err[0] and "--lora-target-modules" in err[0]  # what it has instead
    if "context length" in message:
        assert "(256, from its config.json)" in err[0]


def test_a_gpt2_folder_trains_and_evaluates(gpt2: Path, tmp_path: Path) -> None:
    extra = ("--chat-template", TEMPLATE, "--lora-target-modules", "c_attn", "c_proj")
    assert train_cli(_train(gpt2, tmp_path / "run", *extra)) == 0
    rows = read_metrics(tmp_path / "run")
    assert [r["iteration"] for r in rows] == [0, 1]
    assert all(0 < r["entropy"] < 12 and r["optimizer_steps"] >= 1 for r in rows)
    assert rows[-1]["grad_norm"] > 0  # the LoRA on c_attn / c_proj is trained
    adapter = json.loads((tmp_path / "run/adapters/v000002/adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["c_attn", "c_proj"]
    argv = ["--env", "entrogym/Arithmetic-v0", "--model", str(gpt2), "--engine", "hf",
            "--engine-dtype", "fp32", "--chat-template", TEMPLATE, "--max-tasks", "2",
            "--max-response-tokens", "4", "--max-context-tokens", "128",
            "--adapter", str(tmp_path / "run/checkpoints/iter-000001/adapter")]  # fmt: skip
    assert eval_cli(argv) == 0
