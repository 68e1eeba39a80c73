"""The fast scoring paths (action-only LM head, trimmed and packed micro-batches) give the
log-probs, entropies and gradients of the original padded path."""

from __future__ import annotations

import pytest
import torch
from lora_policy import randomise_lora_b

from entrogym.train.learner.logprobs import (
    LAYOUTS,
    sequence_logprobs,
    sequence_logprobs_and_entropy,
)
from entrogym.train.learner.policy import apply_lora, load_base_model

# fp32 everywhere; the paths differ only in the order of the body's reductions.
LOGP_TOL = 1e-6
GRAD_RTOL = 1e-5
# shared-prefix: each row's attention sums the opening's cache and its own tokens as two
# blocks of one packed row, a few float32 ulps at |log p| ~ 11 (the docs' "within ~1e-5")
SHARED_LOGP_TOL = 1e-5


@pytest.fixture(scope="module", params=["tiny-random-llama", "tiny-random-qwen3"])
def policy(request):
    model = apply_lora(load_base_model(request.param), seed=0)
    randomise_lora_b(model)
    return model


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right padding of different lengths (as collated episodes), one left-padded row, and
    action tokens in two separate turns of each row (feedback between them)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 49152, (4, 30), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, 22:] = 0
    mask[1, 9:] = 0
    mask[3, :5] = 0
    action = torch.zeros_like(ids, dtype=torch.float32)
    action[:, 6:10] = 1.0
    action[:, 14:19] = 1.0
    return ids, mask, action * mask


def _grads(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    return list(torch.autograd.grad(loss, params))


def _weighted_loss(logp: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    weights = torch.linspace(-1.0, 1.5, logp.numel()).reshape(logp.shape)
    return (logp * action * weights).sum()


def _assert_same_grads(got: list[torch.Tensor], ref: list[torch.Tensor]) -> None:
    scale = max(float(g.abs().max()) for g in ref)
    assert scale > 0
    for g, r in zip(got, ref, strict=True):
        assert (g - r).abs().max() <= GRAD_RTOL * scale


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("action_only", [False, True])
def test_fast_paths_match_the_padded_path(policy, layout, action_only):
    ids, mask, action = _batch()
    ref = sequence_logprobs(policy, ids, mask)
    ref_grads = _grads(policy, _weighted_loss(ref, action))
    score_mask = action if action_only else None
    out = sequence_logprobs(policy, ids, mask, score_mask=score_mask, layout=layout)
    keep = action.bool() if action_only else torch.ones_like(mask, dtype=torch.bool)
    assert out.shape == ids.shape and out.dtype == torch.float32
    assert (out - ref)[keep].abs().max() <= LOGP_TOL
    assert out[~keep].eq(0).all()
    assert ref[action.bool()].abs().min() > 1.0  # real log-probs (~ -log V) were compared
    _assert_same_grads(_grads(policy, _weighted_loss(out, action)), ref_grads)


@pytest.mark.parametrize("layout", ["trimmed", "packed"])
def test_entropy_paths_match(policy, layout):
    ids, mask, action = _batch(seed=2)
    ref_lp, ref_ent = sequence_logprobs_and_entropy(policy, ids, mask)
    ref_grads = _grads(policy, ref_ent[action.bool()].sum())
    lp, ent = sequence_logprobs_and_entropy(policy, ids, mask, score_mask=action, layout=layout)
    keep = action.bool()
    assert (lp - ref_lp)[keep].abs().max() <= LOGP_TOL
    assert (ent - ref_ent)[keep].abs().max() <= LOGP_TOL
    assert ent[~keep].eq(0).all() and ref_ent[keep].min() > 1.0
    _assert_same_grads(_grads(policy, ent[keep].sum()), ref_grads)


def test_action_only_keeps_the_softmax_fix_and_bf16_rounding(policy):
    ids, mask, action = _batch(seed=3)
    for opts in ({"softmax_fix": False}, {"bf16_round_logprobs": True}):
        ref = sequence_logprobs(policy, ids, mask, **opts)
        out = sequence_logprobs(policy, ids, mask, score_mask=action, layout="packed", **opts)
        assert (out - ref)[action.bool()].abs().max() <= LOGP_TOL
    rounded = sequence_logprobs(policy, ids, mask, score_mask=action, bf16_round_logprobs=True)
    assert torch.equal(rounded, rounded.bfloat16().float())


def test_bad_score_mask_and_layout_raise(policy):
    ids, mask, action = _batch()
    with pytest.raises(ValueError, match="score_mask must have the shape"):
        sequence_logprobs(policy, ids, mask, score_mask=action[:, :5])
    with pytest.raises(ValueError, match="layout must be one of"):
        sequence_logprobs(policy, ids, mask, layout="ragged")


def _shared_opening_batch(opening: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows that open with the same ``opening`` tokens (a multi-turn env's system prompt),
    right-padded to different lengths, actions in two turns after the opening."""
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 49152, (4, 44), generator=gen)
    ids[:, :opening] = ids[0, :opening]
    mask = torch.ones_like(ids)
    mask[0, 36:] = 0
    mask[2, 30:] = 0
    action = torch.zeros_like(ids, dtype=torch.float32)
    action[:, opening + 3 : opening + 8] = 1.0
    action[:, opening + 12 : opening + 16] = 1.0
    return ids, mask, action * mask


def test_shared_prefix_runs_the_opening_once_and_matches_the_padded_path(policy, monkeypatch):
    from entrogym.train.learner import logprobs

    ids, mask, action = _shared_opening_batch()
    assert logprobs.shared_prefix_length(ids, mask, action) == 20
    ref_lp, ref_ent = sequence_logprobs_and_entropy(policy, ids, mask)
    keep = action.bool()
    ref_grads = _grads(policy, _weighted_loss(ref_lp, action) + ref_ent[keep].sum())
    widths = []
    forward = policy.forward
    monkeypatch.setattr(policy, "forward", lambda **kw: widths.append(kw["input_ids"].shape)
                        or forward(**kw))  # fmt: skip
    lp, ent = sequence_logprobs_and_entropy(policy, ids, mask, score_mask=action,
                                            layout="shared-prefix")  # fmt: skip
    assert widths == [(1, 20), (1, 16 + 24 + 10 + 24)]  # the opening once, then the rest packed
    assert (lp - ref_lp)[keep].abs().max() <= SHARED_LOGP_TOL
    assert (ent - ref_ent)[keep].abs().max() <= SHARED_LOGP_TOL
    assert lp[~keep].eq(0).all() and ent[~keep].eq(0).all()
    _assert_same_grads(_grads(policy, _weighted_loss(lp, action) + ent[keep].sum()), ref_grads)


def test_shared_prefix_stops_before_a_scored_token_and_falls_back_when_short():
    from entrogym.train.learner.logprobs import MIN_SHARED_PREFIX, shared_prefix_length

    ids, mask, action = _shared_opening_batch()
    action[1, 15] = 1.0  # a scored token inside the opening reads position 14
    assert shared_prefix_length(ids, mask, action) == 14
    assert shared_prefix_length(ids, mask, None) == 0  # every position is scored
    assert shared_prefix_length(ids[:1], mask[:1], action[:1]) == 0  # one row: nothing shared
    short, short_mask, short_action = _shared_opening_batch(opening=MIN_SHARED_PREFIX - 1)
    assert shared_prefix_length(short, short_mask, short_action) < MIN_SHARED_PREFIX
