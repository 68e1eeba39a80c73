"""The update on a stale batch (rows sampled by older weight versions): the caller's sampler
log-probs are the ratio's denominator, and the controller sees the entropy of the policy being
trained, estimated by importance weighting; plus the one score-width rule."""

from __future__ import annotations

import math

import pytest
import torch

from entrogym.algos import (
    EntropyControl,
    UpdateBatch,
    build_algorithm,
    importance_weighted_entropy,
    policy_update,
    sampled_entropy,
)


def test_importance_weighted_entropy_estimates_the_other_policys_entropy():
    p = torch.tensor([0.7, 0.2, 0.1])  # the policy whose entropy we want
    q = torch.tensor([0.3, 0.3, 0.4])  # the policy that sampled
    tokens = torch.multinomial(
        q, 200_000, replacement=True, generator=torch.Generator().manual_seed(0)
    )
    logp, logq = p.log()[tokens][None], q.log()[tokens][None]
    mask = torch.ones_like(logp)
    exact = float(-(p * p.log()).sum())
    assert importance_weighted_entropy(logp, logq, mask) == pytest.approx(exact, abs=5e-3)
    assert sampled_entropy(logp, mask) != pytest.approx(exact, abs=5e-2)  # unweighted: biased
    assert importance_weighted_entropy(logq, logq, mask) == pytest.approx(
        sampled_entropy(logq, mask)
    )
    with pytest.raises(ValueError, match="no action tokens"):
        importance_weighted_entropy(logp, logq, torch.zeros_like(mask))


def _stale_batch(theta_sampler: torch.Tensor, **kw) -> tuple[UpdateBatch, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 3, (6, 4), generator=gen)
    mask = torch.ones(6, 4)
    batch = UpdateBatch.build(
        "grpo",
        rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.0]),
        group_ids=torch.tensor([0, 0, 1, 1, 2, 2]),
        mask=mask,
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        **{"versions": torch.tensor([3, 3, 3, 3, 3, 3]), **kw},
    )
    return batch, torch.log_softmax(theta_sampler, -1)[ids]


def test_a_stale_batch_trains_against_the_sampler_and_reports_the_trained_policys_entropy():
    theta = torch.tensor([1.0, 0.0, -1.0], requires_grad=True)  # version 4: being trained
    sampler = torch.tensor([0.2, 0.1, 0.0])  # version 3: sampled the batch
    batch, sampler_lp = _stale_batch(sampler)
    batch.old_logprobs = sampler_lp
    ratios = []

    def score(index, need):
        ids, _ = batch.tokens(index)
        lp = torch.log_softmax(theta, -1)[ids]
        ratios.append((index, torch.exp(lp.detach() - sampler_lp[index])))
        return lp, None

    optimizer = torch.optim.SGD([theta], lr=0.1)
    config = build_algorithm({"name": "grpo", "epochs": 1, "minibatch_size": None})
    current = torch.log_softmax(theta.detach(), -1)[batch.input_ids]
    metrics = policy_update(
        EntropyControl(config),
        batch,
        score=score,
        backward=torch.Tensor.backward,
        step=lambda: optimizer.step() or True,
        zero_grad=optimizer.zero_grad,
        version=4,
    )
    # first minibatch's ratios: pi_new / pi_sampler, not 1
    want = torch.exp(current - sampler_lp)
    index, first = ratios[0]
    torch.testing.assert_close(first, want[index])
    assert (want - 1).abs().max() > 0.1
    assert metrics["entropy"] == pytest.approx(
        importance_weighted_entropy(current, sampler_lp, batch.mask)
    )
    assert metrics["entropy_sampler"] == pytest.approx(sampled_entropy(sampler_lp, batch.mask))
    assert not math.isclose(metrics["entropy"], metrics["entropy_sampler"], rel_tol=1e-3)


def test_a_stale_batch_without_sampler_logprobs_is_refused():
    batch, _ = _stale_batch(torch.zeros(3))
    config = build_algorithm({"name": "grpo"})
    with pytest.raises(ValueError, match="stale batch .* needs the sampling policy's old_logprobs"):
        policy_update(
            EntropyControl(config), batch, score=None, backward=None, step=None,
            zero_grad=lambda: None, version=4,
        )  # fmt: skip


def test_scores_of_the_wrong_width_are_named():
    batch, lp = _stale_batch(torch.zeros(3))
    index = torch.tensor([0, 1])
    batch.check_scores(index, lp[index])
    with pytest.raises(ValueError, match=r"must be \[2, 4\] .* got \[2, 3\]"):
        batch.check_scores(index, lp[index, :3])
    with pytest.raises(ValueError, match=r"versions shape \(5,\) must be \(6,\)"):
        _stale_batch(torch.zeros(3), versions=torch.zeros(5, dtype=torch.long))
