"""The in-process vLLM engine on CUDA: its sampled log-probs agree with the trainer's fp32
scoring of the same tokens. Skips without CUDA (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.models import resolve_model
from entrogym.train.learner.logprobs import sequence_logprobs
from entrogym.train.learner.policy import load_base_model

pytestmark = pytest.mark.gpu
MODEL = "tiny-random-llama"


def test_vllm_on_cuda_samples_what_the_trainer_scores():
    pytest.importorskip("vllm", reason="needs vLLM's CUDA build: pip install -e .[gpu]")
    path = resolve_model(MODEL)
    agent = LLMAgent(AutoTokenizer.from_pretrained(path), max_context=256)
    prompts = [agent.start(f"What is {i} + {i}?").token_ids for i in range(4)]
    # a small share of the GPU: the test needs a few MB of KV cache
    engine = make_engine(
        "vllm", path, dtype="fp32", max_model_len=256, seed=0, gpu_memory_utilization=0.2
    )
    try:
        out = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=1.0))
    finally:
        engine.close()
    assert all(len(c.token_ids) > 0 for c in out)
    model = load_base_model(path, dtype="fp32", device="cuda")
    diffs = []
    for prompt, c in zip(prompts, out, strict=True):
        ids = torch.tensor([prompt + list(c.token_ids)], device="cuda")
        with torch.no_grad():
            lp = sequence_logprobs(model, ids)[0, len(prompt) :].cpu()
        diffs.append((lp - torch.tensor(c.logprobs)).abs())
    assert torch.cat(diffs).mean() < 1e-3
