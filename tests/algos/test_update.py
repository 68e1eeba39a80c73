"""The shared update step: composition order, controllers, skipped steps."""

from __future__ import annotations

import pytest
import torch

from entrogym.algos import (
    EntropyControl,
    UpdateBatch,
    build_algorithm,
    optimizer_steps,
    policy_update,
)
from entrogym.algos.entropy import repo_r


def _tabular(n_arms=4, k=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.nn.Parameter(torch.randn(n_arms, generator=g, dtype=torch.float64))
    actions = torch.multinomial(torch.softmax(logits.detach(), -1), 2 * k, True, generator=g)
    rewards = (actions == 0).double()
    groups = torch.arange(2 * k) // k
    return logits, actions, rewards, groups


def _score_fn(logits, actions):
    def score(index, need_entropy):
        logp_all = torch.log_softmax(logits, -1)
        lp = logp_all[actions[index]][:, None]
        ent = (
            -(logp_all.exp() * logp_all).sum().expand(len(index))[:, None] if need_entropy else None
        )
        return lp, ent

    return score


def _update(cfg, control, logits, actions, rewards, groups, *, score=None, **kw):
    """policy_update on the tabular policy, with its sampled log-probs as old log-probs."""
    old = torch.log_softmax(logits.detach(), -1)[actions][:, None]
    batch = UpdateBatch.build(
        cfg.advantage,
        rewards=rewards,
        group_ids=groups,
        mask=torch.ones_like(old),
        old_logprobs=old,
    )
    kw.setdefault("zero_grad", lambda: setattr(logits, "grad", None))
    return policy_update(control, batch, score=score or _score_fn(logits, actions), **kw)


def test_rloo_update_is_one_plain_policy_gradient_step():
    logits, actions, rewards, groups = _tabular()
    cfg = build_algorithm("rloo")
    opt = torch.optim.SGD([logits], lr=0.1)
    start = logits.detach().clone()

    def step():
        opt.step()
        return True

    m = _update(
        cfg,
        EntropyControl(cfg),
        logits,
        actions,
        rewards,
        groups,
        backward=torch.Tensor.backward,
        step=step,
    )
    # Reference: REINFORCE with the leave-one-out baseline, mean over trajectories.
    ref = start.clone().requires_grad_(True)
    adv = torch.empty(12, dtype=torch.float64)
    for i in range(12):
        same = [j for j in range(12) if groups[j] == groups[i] and j != i]
        adv[i] = rewards[i] - rewards[same].mean()
    obj = (adv * torch.log_softmax(ref, -1)[actions]).mean()
    (grad,) = torch.autograd.grad(obj, ref)
    torch.testing.assert_close(logits.detach(), start + 0.1 * grad)
    assert m["optimizer_steps"] == 1 and m["ratio_max"] == pytest.approx(1.0)


@pytest.mark.parametrize("estimator", ["sampled", "exact"])
def test_repo_r_uses_latest_logprobs_and_controller_moves_after_target(estimator):
    logits, actions, rewards, groups = _tabular(seed=1)
    controller = {"name": "paper", "estimator": estimator}
    cfg = build_algorithm({"name": "repo-r", "minibatch_size": 4, "controller": controller})
    control = EntropyControl(cfg)
    old = torch.log_softmax(logits.detach(), -1)[actions][:, None]
    seen = []

    def backward(loss):
        seen.append(float(loss.detach()))

    _update(
        cfg,
        control,
        logits,
        actions,
        rewards,
        groups,
        backward=backward,
        step=lambda: True,
    )
    assert len(seen) == cfg.epochs * 3  # 12 trajectories in minibatches of 4
    logp = torch.log_softmax(logits.detach(), -1)
    first = float(-old.mean()) if estimator == "sampled" else float(-(logp.exp() * logp).sum())
    assert control.target == pytest.approx(first)
    assert control.coefficient == 1e-3  # the lever's start; the first iteration sets the target
    control.observe(control.target - 1.0)  # entropy fell: zeta doubles
    assert control.coefficient == 2e-3
    # shaping really is REPO-R on the score's log-probs
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    lp = torch.tensor([[-2.0], [-2.0]], dtype=torch.float64)
    shaped = control.lever.shape_advantages(adv, lp, None, control.coefficient)
    torch.testing.assert_close(shaped, repo_r(adv, lp, 2e-3))


def test_entropy_bonus_needs_entropies_and_nan_loss_is_skipped():
    logits, actions, rewards, groups = _tabular(seed=2)
    cfg = build_algorithm({"name": "grpo-entropy-bonus", "minibatch_size": None, "epochs": 1})

    def no_entropy(index, need):
        return torch.log_softmax(logits, -1)[actions[index]][:, None], None

    with pytest.raises(ValueError, match="entropies"):
        _update(
            cfg,
            EntropyControl(cfg),
            logits,
            actions,
            rewards,
            groups,
            score=no_entropy,
            backward=lambda loss: None,
            step=lambda: True,
        )
    m = _update(
        cfg,
        EntropyControl(cfg),
        logits,
        actions,
        rewards,
        groups,
        backward=lambda loss: None,
        step=lambda: False,
    )
    assert m["skipped_steps"] == 1 and m["optimizer_steps"] == 0 and m["beta"] == 1e-3


@pytest.mark.parametrize("aggregation", ["sequence-mean", "token-mean"])
def test_micro_batches_accumulate_to_the_whole_minibatch_gradient(aggregation):
    g = torch.Generator().manual_seed(5)
    table = torch.nn.Parameter(torch.randn(10, 7, dtype=torch.float64, generator=g))
    tokens = torch.randint(0, 7, (10, 5), generator=g)
    mask = (torch.rand(10, 5, generator=g) > 0.3).double()
    mask[:, 0] = 1
    rewards = torch.rand(10, generator=g, dtype=torch.float64)
    groups = torch.arange(10) // 5
    old = (
        torch.log_softmax(table.detach(), -1)[:, None, :]
        .expand(10, 5, 7)
        .gather(2, tokens[..., None])[..., 0]
        + 0.05
    )
    cfg = build_algorithm(
        {"name": "dapo", "epochs": 1, "minibatch_size": None, "loss": {"aggregation": aggregation}}
    )

    def score(index, need):
        lp = torch.log_softmax(table[index], -1)[:, None, :].expand(len(index), 5, 7)
        return lp.gather(2, tokens[index][..., None])[..., 0], None

    grads = []
    for micro in (None, 3):
        batch = UpdateBatch.build(
            cfg.advantage, rewards=rewards, group_ids=groups, mask=mask, old_logprobs=old
        )
        policy_update(
            EntropyControl(cfg),
            batch,
            score=score,
            backward=torch.Tensor.backward,
            step=lambda: grads.append(table.grad.clone()) or True,
            zero_grad=lambda: setattr(table, "grad", None),
            micro_batch_size=micro,
            generator=torch.Generator().manual_seed(0),
        )
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-14)


def test_non_finite_model_scores_skip_the_step_instead_of_raising():
    logits, actions, rewards, groups = _tabular(seed=3)
    cfg = build_algorithm({"name": "repo-r", "minibatch_size": None, "epochs": 1})
    calls = []

    def nan_score(index, need):
        return torch.full((len(index), 1), float("nan"), dtype=torch.float64), None

    m = _update(
        cfg,
        EntropyControl(cfg),
        logits,
        actions,
        rewards,
        groups,
        score=nan_score,
        backward=calls.append,
        step=lambda: True,
    )
    assert m["skipped_steps"] == 1 and m["optimizer_steps"] == 0 and calls == []


@pytest.mark.parametrize(
    ("minibatch_size", "epochs", "steps"), [(None, 2, 2), (5, 2, 6), (4, 1, 3)]
)
def test_on_step_counts_every_optimizer_step_taken_or_skipped(minibatch_size, epochs, steps):
    logits, actions, rewards, groups = _tabular()  # 12 rows
    cfg = build_algorithm({"name": "grpo", "minibatch_size": minibatch_size, "epochs": epochs})
    taken = iter([True, False] * steps)  # every other step is skipped (non-finite grads)
    calls: list[int] = []
    m = _update(
        cfg,
        EntropyControl(cfg),
        logits,
        actions,
        rewards,
        groups,
        backward=lambda loss: None,
        step=lambda: next(taken),
        on_step=lambda: calls.append(1),
    )
    assert optimizer_steps(cfg, len(actions)) == len(calls) == steps
    assert m["optimizer_steps"] + m["skipped_steps"] == steps
