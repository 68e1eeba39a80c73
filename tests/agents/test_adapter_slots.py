"""The ``hf`` engine writes a new adapter version into the layers of the version it evicts
(``adapter_slots.load_into_slot``) where their configs match, samples exactly what a fresh
engine samples with that version, and loads anything else as a new adapter."""

from __future__ import annotations

import shutil

import torch
from lora_policy import randomise_lora_b
from safetensors.torch import load_file, save_file

from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.agents.engines.adapter_slots import load_into_slot
from entrogym.train.learner.policy import LoraSettings, load_policy, save_adapter

PROMPTS = [[1, 5, 9, 13], [1, 7, 2]] * 2
PARAMS = SamplingParams(temperature=1.0, max_tokens=6)


def _save(tmp_path, name: str, seed: int, rank: int = 16) -> str:
    policy = load_policy("tiny-random-llama", lora=LoraSettings(r=rank), seed=0)
    randomise_lora_b(policy, seed)
    return str(save_adapter(policy, tmp_path / name))


def _lora_tensors(engine, adapter_name: str) -> dict[str, torch.Tensor]:
    return {
        n.replace(f".{adapter_name}.", "."): p.detach().clone()
        for n, p in engine._model.named_parameters()
        if f".{adapter_name}." in n
    }


def _sample(engine, adapter: str):
    with engine.seeded(0):
        return [
            (c.token_ids, c.logprobs) for c in engine.generate(PROMPTS, PARAMS, adapter=adapter)
        ]


def test_a_new_version_reuses_the_evicted_layers_and_samples_what_a_fresh_engine_does(tmp_path):
    first, second = _save(tmp_path, "v1", 1), _save(tmp_path, "v2", 2)
    for decode in ("generate", "static"):
        with make_engine("hf", "tiny-random-llama", max_model_len=64, decode=decode) as fresh:
            want = _sample(fresh, second)
        with make_engine("hf", "tiny-random-llama", max_model_len=64, decode=decode) as engine:
            engine.generate(PROMPTS, PARAMS, adapter=first)
            got = _sample(engine, second)
            assert engine._loaded == 1  # one set of LoRA layers was ever built
            assert list(engine._model.peft_config) == ["adapter-1"]
            saved = load_file(f"{second}/adapter_model.safetensors")
            held = _lora_tensors(engine, "adapter-1")
            assert held.keys() == saved.keys()
            assert all(torch.equal(held[k], saved[k].to(held[k].dtype)) for k in saved)
        assert got == want


def test_another_config_is_loaded_as_a_new_adapter(tmp_path):
    first, other = _save(tmp_path, "v1", 1), _save(tmp_path, "r8", 2, rank=8)
    with make_engine("hf", "tiny-random-llama", max_model_len=64) as engine:
        engine.generate(PROMPTS, PARAMS, adapter=first)
        got = _sample(engine, other)
        assert engine._loaded == 2 and list(engine._model.peft_config) == ["adapter-2"]
    with make_engine("hf", "tiny-random-llama", max_model_len=64) as fresh:
        assert got == _sample(fresh, other)


def test_a_version_that_does_not_fill_the_layers_leaves_them_as_they_were(tmp_path):
    first, second = _save(tmp_path, "v1", 1), _save(tmp_path, "v2", 2)
    partial = tmp_path / "partial"
    shutil.copytree(second, partial)
    tensors = load_file(f"{second}/adapter_model.safetensors")
    tensors.pop(sorted(tensors)[0])  # same config, one tensor short
    save_file(tensors, partial / "adapter_model.safetensors")
    with make_engine("hf", "tiny-random-llama", max_model_len=64) as engine:
        engine.generate(PROMPTS, PARAMS, adapter=first)
        before = _lora_tensors(engine, "adapter-1")
        assert not load_into_slot(engine._model, str(partial), "adapter-1", engine.device)
        after = _lora_tensors(engine, "adapter-1")
        assert all(torch.equal(before[k], after[k]) for k in before)
        assert load_into_slot(engine._model, second, "adapter-1", engine.device)
        assert not all(
            torch.equal(before[k], v) for k, v in _lora_tensors(engine, "adapter-1").items()
        )
