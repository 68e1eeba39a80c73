"""The ``hf`` engine's static decode paths on CUDA: ``static`` samples the tokens ``generate``
samples under a seed, with the same log-probs; ``static-cdf`` records, for every sampled token,
the log-prob a teacher-forced forward of the same model gives, and a seed repeats its tokens.
Skips without CUDA (tests/conftest.py)."""

from __future__ import annotations

import pytest
from forced_logprobs import teacher_forced_logprobs

from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.models import resolve_model

pytestmark = pytest.mark.gpu
MODEL = "tiny-random-llama"
PROMPTS = [[1, 5, 9, 13], [1, 7, 2], [1, 4, 4, 8, 3, 11, 12]] * 2
PARAMS = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)


def _sample(decode: str, seed: int = 0, params: SamplingParams = PARAMS):
    engine = make_engine("hf", MODEL, dtype="fp32", max_model_len=64, decode=decode, device="cuda")
    with engine, engine.seeded(seed):
        return engine.generate(PROMPTS, params)


def test_static_samples_what_generate_samples_on_cuda():
    static, generated = _sample("static"), _sample("generate")
    assert [c.token_ids for c in static] == [c.token_ids for c in generated]
    for s, g in zip(static, generated, strict=True):
        assert s.logprobs == pytest.approx(g.logprobs, abs=1e-4)


def test_static_cdf_logprobs_are_the_models_on_cuda():
    from transformers import AutoModelForCausalLM

    out = _sample("static-cdf")
    model = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)).cuda().eval()
    for prompt, completion in zip(PROMPTS, out, strict=True):
        want = teacher_forced_logprobs(model, prompt, completion.token_ids)
        assert completion.logprobs == pytest.approx(want, abs=1e-4)
    assert len({tuple(c.token_ids) for c in out}) > 1  # rows differ: a real sample
    again, other = _sample("static-cdf", 0), _sample("static-cdf", 1)
    assert [c.token_ids for c in again] == [c.token_ids for c in out]
    assert [c.token_ids for c in other] != [c.token_ids for c in out]
