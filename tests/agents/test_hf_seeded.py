"""``Engine.seeded`` on the ``hf`` engine: a seeded scope samples the same whatever the engine
sampled or loaded before it (evaluation and asynchronous rollouts rely on it)."""

from __future__ import annotations

import torch
from lora_policy import randomise_lora_b

from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.models import resolve_model
from entrogym.train.learner.policy import LoraSettings, load_policy, save_adapter

PROMPTS = [[1, 5, 9, 13], [1, 7, 2], [1, 4, 4, 8, 3]] * 2
PARAMS = SamplingParams(temperature=1.0, max_tokens=6)


def _adapters(tmp_path) -> list[str]:
    policy = load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings())
    folders = []
    for seed in (1, 2):  # two different adapters
        randomise_lora_b(policy, seed)
        folders.append(str(tmp_path / f"a{seed}"))
        save_adapter(policy, folders[-1])
    return folders


def _seeded_sample(history: list[str | None], adapter: str) -> tuple[list, list]:
    engine = make_engine("hf", "tiny-random-llama", dtype="fp32", max_model_len=64)
    try:
        for used in history:  # what the engine sampled (and loaded) before
            engine.generate(PROMPTS, PARAMS, adapter=used)
        with engine.seeded(0):
            out = engine.generate(PROMPTS, PARAMS, adapter=adapter)
    finally:
        engine.close()
    return [c.token_ids for c in out], [c.logprobs for c in out]


def test_a_seeded_scope_samples_the_same_whether_or_not_its_adapter_was_loaded(tmp_path):
    first, second = _adapters(tmp_path)
    fresh = _seeded_sample([], second)  # the scope loads the adapter itself
    preloaded = _seeded_sample([first, second], second)  # already held: nothing to load
    base_before = _seeded_sample([None], second)
    assert fresh == preloaded == base_before
    other = _seeded_sample([], first)
    assert other[1] != fresh[1]  # another adapter: other log-probs (the check can fail)


def test_a_seeded_scope_leaves_the_global_stream_where_it_was(tmp_path):
    _, adapter = _adapters(tmp_path)
    engine = make_engine("hf", "tiny-random-llama", dtype="fp32", max_model_len=64)
    try:
        torch.manual_seed(123)
        with engine.seeded(0):
            engine.generate(PROMPTS, PARAMS, adapter=adapter)
        after = torch.rand(3)
    finally:
        engine.close()
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(3))
