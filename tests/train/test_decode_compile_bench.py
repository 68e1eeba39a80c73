"""benchmarks/decode_compile.py: the decoder with its one-token step compiled in pieces samples
the tokens the eager decoder samples under a seed, with the same log-probs (same math, fused)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import decode_compile  # noqa: E402

from entrogym.agents.engines import (  # noqa: E402
    SamplingParams,
    make_engine,
    static_decode,
)

PROMPTS = [[1, 5, 9, 13], [1, 7, 2], [1, 4, 4, 8, 3, 11, 12]] * 2
PARAMS = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)


def _sample():
    engine = make_engine("hf", "tiny-random-llama", dtype="fp32", max_model_len=64,
                         decode="static-cdf")  # fmt: skip
    with engine, engine.seeded(0):
        return engine.generate(PROMPTS, PARAMS)


def test_compiled_step_samples_what_the_eager_step_samples(monkeypatch):
    eager = _sample()
    monkeypatch.setattr(
        static_decode.StaticDecoder, "_forward", static_decode.StaticDecoder._forward
    )  # restored after the test, as is the layout choice the patch turns off
    monkeypatch.setattr(
        static_decode.StaticDecoder, "__init__", static_decode.StaticDecoder.__init__
    )
    decode_compile.patch_decoder()
    assert static_decode.StaticDecoder._forward.__name__ == "forward"
    compiled = _sample()
    assert [c.token_ids for c in compiled] == [c.token_ids for c in eager]
    for c, e in zip(compiled, eager, strict=True):
        assert c.logprobs == pytest.approx(e.logprobs, abs=1e-5)
