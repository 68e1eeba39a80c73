"""Samplers sample from the policy: ``sampler_entropy_gap`` on synthetic draws and on the hf
engine (tiny random Llama: a nearly flat next-token distribution over 49152 tokens, so top-50
truncation moves the sampled -log pi by most of a nat)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.models import resolve_model
from entrogym.train.learner.mismatch import (
    ENTROPY_GAP_MAX_Z,
    engine_entropy_gap,
    sampler_entropy_gap,
)

MODEL = "tiny-random-llama"


def categorical_draws(top_k: int | None, n: int = 4000, vocab: int = 40, seed: int = 0):
    """``n`` states with random logits; one token drawn per state from the full softmax or
    from its ``top_k`` likeliest tokens. Returns (logprobs, entropies, mask) of shape [1, n]."""
    g = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(2.0 * torch.randn(n, vocab, generator=g, dtype=torch.float64), -1)
    draw = logp.clone()
    if top_k is not None:
        kth = draw.topk(top_k, -1).values[:, -1:]
        draw = draw.masked_fill(draw < kth, float("-inf"))
    tokens = torch.multinomial(draw.softmax(-1), 1, generator=g)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, tokens).T, entropy[None], torch.ones(1, n)


def test_entropy_gap_passes_an_exact_sampler_and_fails_a_truncating_one():
    exact = sampler_entropy_gap(*categorical_draws(None))
    assert exact["num_tokens"] == 4000 and abs(exact["z"]) < ENTROPY_GAP_MAX_Z, exact
    assert exact["gap"] == pytest.approx(exact["mean_neg_logprob"] - exact["mean_entropy"])
    top5 = sampler_entropy_gap(*categorical_draws(5))
    assert top5["z"] < -ENTROPY_GAP_MAX_Z and top5["gap"] < -0.1, top5


def test_entropy_gap_leaves_out_non_finite_positions_and_checks_input():
    logp, ent, mask = categorical_draws(None, n=10)
    logp[0, 3], ent[0, 5] = float("nan"), float("inf")
    mask[0, 0] = 0
    out = sampler_entropy_gap(logp, ent, mask)
    assert out["num_tokens"] == 7 and out["nonfinite"] == 2
    assert all(v is None or v == v for v in out.values())  # never NaN
    json.dumps(out, allow_nan=False)
    with pytest.raises(ValueError, match="one shape"):
        sampler_entropy_gap(logp[:, :5], ent, mask)
    with pytest.raises(ValueError, match="no tokens"):
        sampler_entropy_gap(logp, ent, torch.zeros_like(mask))
    one = sampler_entropy_gap(logp[:, 1:2], ent[:, 1:2], mask[:, 1:2])
    assert one["num_tokens"] == 1 and one["z"] is None


PROMPT = [1, 504, 3158, 314, 253, 1345, 28]


def sample_and_score(engine, model, params: SamplingParams, prompts: int = 40):
    return engine_entropy_gap(engine, model, PROMPT, params, samples=prompts)


@pytest.fixture(scope="module")
def engine_and_model():
    path = resolve_model(MODEL)
    engine = make_engine("hf", path, dtype="fp32", max_model_len=256, seed=0)
    yield engine, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine.close()


def test_hf_engine_samples_the_full_distribution(engine_and_model):
    engine, model = engine_and_model
    exact = sample_and_score(engine, model, SamplingParams(max_tokens=32, temperature=1.0))
    assert exact["num_tokens"] >= 1000 and abs(exact["z"]) < ENTROPY_GAP_MAX_Z, exact
    # the fault the check exists for: transformers' default top-k of 50
    top50 = sample_and_score(engine, model, SamplingParams(max_tokens=32, top_k=50, seed=1))
    assert top50["num_tokens"] >= 1000 and top50["z"] < -ENTROPY_GAP_MAX_Z, top50


def test_hf_engine_ignores_the_checkpoint_sampling_settings(tmp_path):
    """A checkpoint whose generation_config asks for top-k 5 must not truncate the sampler."""
    src = resolve_model(MODEL)
    shutil.copytree(src, tmp_path / "m")
    config = {"top_k": 5, "top_p": 0.5, "do_sample": True, "eos_token_id": 0}
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps(config))
    engine = make_engine("hf", str(tmp_path / "m"), dtype="fp32", max_model_len=256, seed=0)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    out = sample_and_score(engine, model, SamplingParams(max_tokens=16), prompts=16)
    assert out["num_tokens"] >= 200 and abs(out["z"]) < ENTROPY_GAP_MAX_Z, out
    engine.close()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hf_engine_logprobs_are_the_raw_logits_log_softmax_at_each_sampled_id(
    engine_and_model, temperature
):
    """The engine records log_softmax(raw logits)[id] step by step (not the tempered
    distribution); teacher-forcing the model on each unpadded prompt + completion gives the
    same numbers, for every row of a left-padded batch."""
    engine, model = engine_and_model
    prompts = [PROMPT, PROMPT[:4], PROMPT[2:]]
    params = [SamplingParams(max_tokens=12, temperature=temperature, seed=3, stop_token_ids=[28])]
    outs = engine.generate(prompts, params * len(prompts))
    for prompt, out in zip(prompts, outs, strict=True):
        assert len(out.logprobs) == len(out.token_ids) >= 1
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        want = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
        assert torch.allclose(torch.tensor(out.logprobs), want, atol=1e-4), (out, want)
