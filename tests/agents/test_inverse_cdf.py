"""The ``static-cdf`` decode path's draw (``inverse_cdf_draw``) against independent
computations: the index an exact linear scan of the cumulative mass gives for the same
uniforms, the frequencies of many draws against the probabilities (chi-square), zero-mass
entries never drawn; and the engine path end to end: log-probs equal to a teacher-forced
forward of the sampled tokens, the same tokens under the same seed."""

from __future__ import annotations

import math

import pytest
import torch
from forced_logprobs import teacher_forced_logprobs
from scipy.stats import chisquare

from entrogym.agents.engines import SamplingParams, draws, make_engine
from entrogym.agents.engines.draws import inverse_cdf_draw
from entrogym.models import resolve_model


def _scan(row: list[float], u: float) -> int:
    """The smallest i whose exact cumulative mass exceeds u * total (math.fsum: exact sums)."""
    target = u * math.fsum(row)
    for i in range(len(row)):
        if math.fsum(row[: i + 1]) > target:
            return i
    raise AssertionError("no entry exceeds the target")


def test_the_draw_is_the_index_an_exact_scan_gives():
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(64, 37, generator=gen) ** 4  # uneven rows, not normalised
    probs[:, 5] = 0.0
    torch.manual_seed(1)
    got = inverse_cdf_draw(probs)
    torch.manual_seed(1)
    uniforms = torch.rand(64, 1, dtype=torch.float64)[:, 0].tolist()
    rows = probs.double().tolist()
    assert got.tolist() == [_scan(r, u) for r, u in zip(rows, uniforms, strict=True)]


def test_rows_of_many_blocks_draw_the_index_an_exact_scan_gives():
    """Rows wider than a block (and not a whole number of blocks), with whole blocks of zero
    mass: the two-level search gives what one exact scan of the row gives."""
    from fractions import Fraction
    from itertools import accumulate

    width = 3 * draws.CDF_BLOCK + 77
    gen = torch.Generator().manual_seed(2)
    probs = torch.rand(16, width, generator=gen) ** 6
    probs[:, : draws.CDF_BLOCK] = 0.0  # the first block has no mass
    probs[::3, 2 * draws.CDF_BLOCK : 3 * draws.CDF_BLOCK] = 0.0
    torch.manual_seed(3)
    got = inverse_cdf_draw(probs)
    torch.manual_seed(3)
    uniforms = torch.rand(16, 1, dtype=torch.float64)[:, 0].tolist()
    for row, u, index in zip(probs.double().tolist(), uniforms, got.tolist(), strict=True):
        exact = [Fraction(x) for x in row]
        target = Fraction(u) * sum(exact)
        # the smallest i whose exact cumulative mass exceeds the target
        want = next(i for i, mass in enumerate(accumulate(exact)) if mass > target)
        assert index == want and row[index] > 0


def test_the_frequencies_match_the_probabilities():
    p = torch.tensor([0.5, 0.25, 0.0, 0.125, 0.0625, 0.0625, 0.0])
    n = 200_000
    torch.manual_seed(0)
    draws = inverse_cdf_draw(p.expand(n, -1))
    counts = torch.bincount(draws, minlength=len(p))
    assert counts[p == 0].sum() == 0  # cut entries (top-k / top-p) are never drawn
    keep = p > 0
    expected = (p[keep] * n).tolist()
    assert chisquare(counts[keep].tolist(), expected).pvalue > 1e-3
    # a draw that ignored the probabilities would fail: uniform over the kept entries
    uniform = [n / int(keep.sum())] * int(keep.sum())
    assert chisquare(counts[keep].tolist(), uniform).pvalue < 1e-6


@pytest.mark.parametrize(
    ("uniform", "want"),
    [(0.0, [2, 0, 1]), (math.nextafter(1.0, 0.0), [3, 2, 2])],
    ids=["smallest", "largest"],
)
def test_the_extreme_uniforms_never_draw_zero_mass(monkeypatch, uniform, want):
    probs = torch.tensor(
        [[0.0, 0.0, 0.3, 0.7, 0.0], [1e-30, 0.0, 2e-30, 0.0, 0.0], [0.0, 1.5, 1.5, 0.0, 0.0]]
    )
    fixed = torch.rand  # the draw's uniforms, pinned at the ends of [0, 1)
    monkeypatch.setattr(
        draws.torch, "rand", lambda *a, **kw: torch.full_like(fixed(*a, **kw), uniform)
    )
    assert inverse_cdf_draw(probs).tolist() == want


def _engine(decode: str):
    return make_engine("hf", "tiny-random-llama", dtype="fp32", max_model_len=64, decode=decode)


PROMPTS = [[1, 5, 9, 13], [1, 7, 2], [1, 4, 4, 8, 3, 11, 12]] * 2
PARAMS = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)


def _sample(decode: str, seed: int, params: SamplingParams = PARAMS):
    with _engine(decode) as engine, engine.seeded(seed):
        return engine.generate(PROMPTS, params)


def test_the_recorded_logprobs_are_the_models_for_the_sampled_tokens():
    from transformers import AutoModelForCausalLM

    out = _sample("static-cdf", seed=0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-random-llama")).eval()
    for prompt, completion in zip(PROMPTS, out, strict=True):
        want = teacher_forced_logprobs(model, prompt, completion.token_ids)
        assert completion.logprobs == pytest.approx(want, abs=1e-5)
    assert len({tuple(c.token_ids) for c in out}) > 1  # rows differ: a real sample


def test_a_seed_gives_the_same_tokens_and_another_seed_other_tokens():
    first, again, other = (_sample("static-cdf", s) for s in (0, 0, 1))
    tokens = [[c.token_ids for c in out] for out in (first, again, other)]
    assert tokens[0] == tokens[1]
    assert tokens[0] != tokens[2]


def test_greedy_decoding_is_generates():
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    want = [c.token_ids for c in _sample("generate", 0, greedy)]
    assert [c.token_ids for c in _sample("static-cdf", 0, greedy)] == want
