"""Fault injection: a rollout engine whose sampler truncates (top-k) without being asked to.

Such an engine reports exact log-probs for the tokens it picks, so the sampler/trainer
log-prob mismatch reads ~0 and cannot see the fault; ``sampler_entropy_gap`` must.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.agents.rollout import collect_rollouts
from entrogym.envs.base import make_text_env, task_ids_of
from entrogym.models import resolve_model
from entrogym.train.learner.mismatch import (
    ENTROPY_GAP_MAX_Z,
    episodes_entropy_gap,
    episodes_mismatch,
)


class TopKEngine:
    """Test double: the hf engine with top-k forced onto every request (the injected fault)."""

    def __init__(self, engine, top_k: int) -> None:
        self.engine, self.top_k = engine, top_k
        self.max_model_len = engine.max_model_len

    def generate(self, prompts, params, adapter=None):
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        return self.engine.generate(
            prompts, [replace(p, top_k=self.top_k) for p in params], adapter
        )


def test_truncating_sampler_is_caught_by_the_entropy_gap():
    path = resolve_model("tiny-random-llama")
    engine = make_engine("hf", path, dtype="fp32", max_model_len=512, seed=0)
    agent = LLMAgent(AutoTokenizer.from_pretrained(path), max_turn_tokens=32, max_context=512)
    env = make_text_env("entrogym/Arithmetic-v0")
    tasks = task_ids_of(env, "train")[:4]
    env.close()
    eps = collect_rollouts(
        "entrogym/Arithmetic-v0", tasks, TopKEngine(engine, 50), agent, k=4, early_stop=False
    )
    engine.close()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert episodes_mismatch(model, eps)["mean_abs_diff"] < 1e-4  # blind to the fault
    gap = episodes_entropy_gap(model, eps)
    assert gap["num_tokens"] >= 400, gap
    assert gap["z"] < -ENTROPY_GAP_MAX_Z and gap["gap"] < -0.3, gap
    with pytest.raises(ValueError, match="temperature"):
        from entrogym.train.learner.mismatch import engine_entropy_gap

        engine_entropy_gap(engine, model, [1, 2], SamplingParams(temperature=0.0))
