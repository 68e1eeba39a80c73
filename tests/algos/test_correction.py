"""Sampler-mismatch importance weights: each mode against a plain-Python computation of TRL's
documented rule, on ragged masks, with and without a lower bound."""

from __future__ import annotations

import math

import pytest
import torch

from entrogym.algos import CORRECTION_MODES, check_correction, sampler_weights

# three trajectories of 5 tokens: sampled lengths 5, 3 and 1 (ragged), padded with 0
MASK = [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 1, 0, 0, 0]]


def _logprobs(seed: int) -> tuple[list[list[float]], list[list[float]]]:
    """Learner and sampler log-probs whose token ratios fall on both sides of 0.5 and 3."""
    g = torch.Generator().manual_seed(seed)
    sampler = (-torch.rand(3, 5, generator=g, dtype=torch.float64) * 3).tolist()
    shift = (torch.randn(3, 5, generator=g, dtype=torch.float64) * 1.2).tolist()
    learner = [
        [s + d for s, d in zip(rs, rd, strict=True)] for rs, rd in zip(sampler, shift, strict=True)
    ]
    return learner, sampler


def _bound(r: float, mode: str, lo: float | None, hi: float | None) -> float:
    lo_, hi_ = (-math.inf if lo is None else lo), (math.inf if hi is None else hi)
    if mode.endswith("truncate"):
        return min(max(r, lo_), hi_)
    return r if lo_ <= r <= hi_ else 0.0


def _reference(learner, sampler, mask, mode, lo, hi) -> list[list[float]]:
    """TRL's rule written out token by token with math.exp."""
    out = []
    for lrow, srow, mrow in zip(learner, sampler, mask, strict=True):
        if mode.startswith("sequence"):
            total = 0.0
            for lp, sp, m in zip(lrow, srow, mrow, strict=True):
                if m:
                    total += lp - sp
            w = _bound(math.exp(total), mode, lo, hi)
            out.append([w if m else 0.0 for m in mrow])
        else:
            row = []
            for lp, sp, m in zip(lrow, srow, mrow, strict=True):
                row.append(_bound(math.exp(lp - sp), mode, lo, hi) if m else 0.0)
            out.append(row)
    return out


@pytest.mark.parametrize("mode", CORRECTION_MODES)
@pytest.mark.parametrize("bounds", [(None, 3.0), (0.5, 3.0), (0.8, 1.5)])
def test_each_mode_matches_a_token_by_token_computation(mode, bounds) -> None:
    lo, hi = bounds
    learner, sampler = _logprobs(0)
    got = sampler_weights(
        torch.tensor(learner), torch.tensor(sampler), torch.tensor(MASK), mode, lo, hi
    )
    want = _reference(learner, sampler, MASK, mode, lo, hi)
    assert got.shape == (3, 5) and got.dtype == torch.float32
    assert got.flatten().tolist() == pytest.approx(sum(want, []), rel=1e-5, abs=1e-6)


def test_the_cases_above_reach_every_branch() -> None:
    """The data has ratios below 0.5, between the bounds and above 3, so the bounds act."""
    learner, sampler = _logprobs(0)
    ratios = [
        math.exp(lp - sp)
        for lrow, srow, mrow in zip(learner, sampler, MASK, strict=True)
        for lp, sp, m in zip(lrow, srow, mrow, strict=True)
        if m
    ]
    assert min(ratios) < 0.5 and max(ratios) > 3.0 and any(0.8 <= r <= 1.5 for r in ratios)
    seq = [_reference(learner, sampler, MASK, "sequence_mask", None, None)[i][1] for i in range(3)]
    assert seq[0] > 3.0 and seq[1] < 0.5 and 0.5 < seq[2] < 3.0  # sequence ratios: each side too


def test_clip_min_sets_a_floor_only_when_given() -> None:
    lp = torch.tensor([[-3.0, 0.0]])  # token ratios exp(-3) ~ 0.05 and 1
    sp = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    no_floor = sampler_weights(lp, sp, mask, "token_truncate")
    floored = sampler_weights(lp, sp, mask, "token_truncate", clip_min=0.5)
    masked = sampler_weights(lp, sp, mask, "token_mask", clip_min=0.5)
    assert no_floor[0, 0].item() == pytest.approx(math.exp(-3.0))
    assert floored[0].tolist() == pytest.approx([0.5, 1.0])
    assert masked[0].tolist() == pytest.approx([0.0, 1.0])


def test_sequence_ratio_sums_log_ratios_and_a_sequence_mask_drops_the_row() -> None:
    # two tokens of log ratio 0.7 each: the sequence ratio is exp(1.4) ~ 4.06, not exp(0.7) ~ 2
    lp = torch.tensor([[0.7, 0.7, 9.0], [0.1, -0.1, 0.0]])
    sp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    trunc = sampler_weights(lp, sp, mask, "sequence_truncate", clip_max=5.0)
    dropped = sampler_weights(lp, sp, mask, "sequence_mask", clip_max=3.0)
    assert trunc[0].tolist() == pytest.approx([math.exp(1.4), math.exp(1.4), 0.0])
    assert dropped[0].tolist() == [0.0, 0.0, 0.0]
    assert dropped[1].tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_weights_carry_no_gradient() -> None:
    learner, sampler = _logprobs(1)
    lp = torch.tensor(learner, requires_grad=True)
    sp = torch.tensor(sampler, requires_grad=True)
    for mode in CORRECTION_MODES:
        w = sampler_weights(lp, sp, torch.tensor(MASK), mode)
        assert not w.requires_grad and w.grad_fn is None


def test_non_finite_sampler_logprob_zeroes_its_token_or_its_sequence() -> None:
    lp = torch.zeros(2, 3)
    sp = torch.tensor([[0.0, -math.inf, 0.0], [0.0, 0.0, math.nan]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # row 1's NaN is on padding: ignored
    token = sampler_weights(lp, sp, mask, "token_truncate")
    seq = sampler_weights(lp, sp, mask, "sequence_truncate")
    assert token.tolist() == [[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    assert seq.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    assert torch.isfinite(token).all() and torch.isfinite(seq).all()


def test_non_finite_learner_logprob_is_an_error() -> None:
    lp = torch.tensor([[0.0, math.nan]])
    with pytest.raises(ValueError, match="learner_logprobs contains NaN"):
        sampler_weights(lp, torch.zeros(1, 2), torch.ones(1, 2), "token_mask")


@pytest.mark.parametrize(
    ("mode", "lo", "hi", "match"),
    [
        ("token_clip", None, 3.0, "unknown sampler correction mode 'token_clip'; use one of"),
        ("token_mask", None, 0.0, r"clip_max must be > 0"),
        ("token_mask", None, -1.0, r"clip_max must be > 0"),
        ("sequence_mask", 2.0, 1.5, r"clip_min \(2.0\) must be less than clip_max \(1.5\)"),
        ("sequence_mask", 2.0, 2.0, r"clip_min \(2.0\) must be less than clip_max \(2.0\)"),
        ("token_truncate", -0.1, 3.0, r"clip_min must be >= 0"),
        ("token_truncate", None, math.nan, r"clip_max must be a finite number"),
    ],
)
def test_bad_settings_are_one_line_errors(mode, lo, hi, match) -> None:
    with pytest.raises(ValueError, match=match) as info:
        check_correction(mode, lo, hi)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=match):  # sampler_weights checks them too
        sampler_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), mode, lo, hi)


def test_good_settings_pass_and_shapes_are_checked() -> None:
    for mode in CORRECTION_MODES:
        check_correction(mode, None, 3.0)
        check_correction(mode, 0.5, 2.0)
        check_correction(mode, 0.5, None)  # TRL: a floor without a cap
    with pytest.raises(ValueError, match="mask shape"):
        sampler_weights(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 2), "token_mask")
