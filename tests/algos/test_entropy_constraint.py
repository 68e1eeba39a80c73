"""The entropy-constraint lever (augmented Lagrangian of H = H*) against a hand computation of its
gradient, and its one property the plain bonus lacks: it pushes toward the target from both
sides and stops there."""

from __future__ import annotations

import pytest
import torch

from entrogym.algos import EntropyControl, UpdateBatch, build_algorithm, policy_update
from entrogym.algos.entropy import (
    entropy_constraint_loss,
    entropy_constraint_push_loss,
    sampled_entropy,
)


def _entropies(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ent = (torch.rand(4, 6, generator=g, dtype=torch.float64) * 3).requires_grad_()
    mask = torch.ones(4, 6, dtype=torch.float64)
    mask[1, 2:] = 0
    return ent, mask


@pytest.mark.parametrize(("multiplier", "target", "penalty"),
                         [(0.0, 2.0, 0.2), (0.05, 1.0, 0.5), (-0.03, 3.5, 1.0)])  # fmt: skip
def test_its_gradient_is_a_bonus_of_multiplier_plus_penalty_times_the_relative_error(
    multiplier, target, penalty
):
    ent, mask = _entropies()
    loss = entropy_constraint_loss(ent, mask, multiplier, target, penalty)
    (grad,) = torch.autograd.grad(loss, ent)
    # by hand: d/dH of -m H + p/2 H* ((H* - H)/H*)^2 is -(m + p (H* - H)/H*), and H is the
    # mask-weighted mean of the token entropies
    n = float(mask.sum())
    mean = float((ent.detach() * mask).sum()) / n
    beta = multiplier + penalty * (target - mean) / target
    torch.testing.assert_close(grad, -beta * mask / n)


def test_at_the_target_only_the_multiplier_acts():
    ent, mask = _entropies(1)
    mean = float((ent.detach() * mask).sum() / mask.sum())
    (at,) = torch.autograd.grad(entropy_constraint_loss(ent, mask, 0.07, mean, 5.0), ent)
    (bonus,) = torch.autograd.grad(entropy_constraint_loss(ent, mask, 0.07, mean, 0.0), ent)
    torch.testing.assert_close(at, bonus)


# A multiplier held where it starts (the target reaches the lever only through a controller
# that has one): the penalty alone acts.
HELD = {"name": "pi", "kp": 0.0, "ki": 0.0}


def _tabular_run(algo: dict, sharpness: float, steps: int = 60) -> tuple[list[float], float]:
    """A uniform-reward tabular policy (every advantage 0: only the lever moves it) trained by
    SGD through ``policy_update``; returns the exact mean entropy per iteration and the target."""
    torch.manual_seed(0)
    n_states, n_arms, k = 6, 8, 4
    logits = torch.nn.Parameter(torch.randn(n_states, n_arms) * sharpness)
    states = torch.arange(n_states).repeat_interleave(k)
    optimizer = torch.optim.SGD([logits], lr=10.0)
    config = build_algorithm({"epochs": 1, "minibatch_size": n_states * k, **algo})
    control = EntropyControl(config)

    def entropy_now() -> float:
        logp = torch.log_softmax(logits.detach(), -1)
        return float(-(logp.exp() * logp).sum(-1).mean())

    trace = []
    for _ in range(steps):
        actions = torch.multinomial(torch.softmax(logits.detach(), -1)[states], 1).flatten()

        def score(index, need_entropy, actions=actions):
            logp = torch.log_softmax(logits[states[index]], -1)
            ent = -(logp.exp() * logp).sum(-1, keepdim=True)
            return logp.gather(1, actions[index, None]), ent if need_entropy else None

        batch = UpdateBatch.build(config.advantage, rewards=torch.ones(len(states)),
                                  group_ids=states, mask=torch.ones(len(states), 1))  # fmt: skip
        policy_update(control, batch, score=score, backward=torch.Tensor.backward,
                      step=lambda: optimizer.step() or True,
                      zero_grad=optimizer.zero_grad)  # fmt: skip
        trace.append(entropy_now())
    return trace, control.target


@pytest.mark.parametrize("sharpness", [0.5, 3.0])  # start near uniform, or peaked
def test_the_constraint_settles_at_an_absolute_target_from_either_side(sharpness):
    algo = {"name": "grpo", "lever": {"name": "entropy-constraint", "penalty": 3.0},
            "controller": HELD | {"init": 0.0, "target": 1.2, "target_unit": "nats"}}  # fmt: skip
    trace, target = _tabular_run(algo, sharpness)
    assert target == 1.2
    assert abs(trace[0] - target) > 0.2  # it starts away from the target
    assert all(abs(h / target - 1) < 0.05 for h in trace[-10:]), trace


@pytest.mark.parametrize("upper_slack", [0.0, 0.2])
def test_a_push_on_some_rows_is_the_constraints_bonus_there_and_nothing_elsewhere(upper_slack):
    ent, mask = _entropies(2)
    m, target, penalty = 0.02, 1.0, 0.8
    (whole,) = torch.autograd.grad(
        entropy_constraint_loss(ent, mask, m, target, penalty, upper_slack), ent
    )
    (same,) = torch.autograd.grad(
        entropy_constraint_push_loss(ent, mask, mask, m, target, penalty, upper_slack), ent
    )
    torch.testing.assert_close(same, whole)  # pushing on every token is the constraint
    push = mask.clone()
    push[0] = 0
    push[2] = 0
    (grad,) = torch.autograd.grad(
        entropy_constraint_push_loss(ent, mask, push, m, target, penalty, upper_slack), ent
    )
    # by hand: the error from every token of mask, the bonus spread over the pushed ones only
    mean = float((ent.detach() * mask).sum() / mask.sum())
    error = (target - mean) / target
    error = error if error > 0 else min(error + upper_slack, 0.0)
    torch.testing.assert_close(grad, -(m + penalty * error) * push / float(push.sum()))
    nothing = entropy_constraint_push_loss(ent, mask, torch.zeros_like(mask), m, target, penalty)
    assert float(nothing) == 0.0 and not torch.autograd.grad(nothing, ent)[0].any()


@pytest.mark.parametrize(("rows", "moves"), [("all", True), ("mixed", False)])
def test_rows_mixed_leaves_groups_of_equal_rewards_alone(rows, moves):
    # every reward is 1: no group carries a policy gradient, so only the lever could move the
    # policy; with rows: mixed it does not
    algo = {"name": "grpo",
            "lever": {"name": "entropy-constraint", "penalty": 3.0, "rows": rows},
            "controller": HELD | {"init": 0.0, "target": 1.2, "target_unit": "nats"}}  # fmt: skip
    trace, _ = _tabular_run(algo, 3.0)
    assert (abs(trace[-1] - trace[0]) > 0.1) == moves, trace


def test_a_plain_bonus_of_the_same_size_does_not_stop_at_the_target():
    # the same push at the start (beta = penalty * relative error), held fixed: it overshoots
    # toward the uniform policy's log 8 = 2.08 nats
    trace0, _ = _tabular_run(
        {"name": "grpo", "lever": {"name": "entropy-constraint", "penalty": 0.0},
         "controller": HELD | {"init": 0.5, "max": 1.0, "target": 1.2, "target_unit": "nats"}},
        3.0,
    )  # fmt: skip
    assert trace0[-1] > 1.2 * 1.4, trace0


@pytest.mark.parametrize("estimator", ["sampled", "exact"])
def test_the_ratio_target_is_the_first_iterations_entropy_also_for_step_feedback(estimator):
    """Fed every optimizer step, the controller's ratio target is still taken from the first
    iteration's entropy (of its experience, by the controller's estimator), known before the
    first step, and the lever sees that target from the first step's feedback on."""
    torch.manual_seed(1)
    logits = torch.nn.Parameter(torch.randn(4, 5))
    states = torch.arange(4).repeat_interleave(4)
    actions = torch.multinomial(torch.softmax(logits.detach(), -1)[states], 1).flatten()
    start = torch.log_softmax(logits.detach(), -1)[states]
    config = build_algorithm({"name": "grpo", "lever": "entropy-constraint", "epochs": 1,
                              "minibatch_size": 4,
                              "controller": {"name": "pi", "estimator": estimator}})  # fmt: skip
    control = EntropyControl(config)
    assert control.controller.params.step == "optimizer" and control.target is None
    seen = []  # the target each loss told the lever
    extra = control.lever.extra_loss

    def recording_extra(*args, target, **kwargs):
        seen.append(target)
        return extra(*args, target=target, **kwargs)

    control.lever.extra_loss = recording_extra

    def score(index, need_entropy):
        logp = torch.log_softmax(logits[states[index]], -1)
        ent = -(logp.exp() * logp).sum(-1, keepdim=True)
        return logp.gather(1, actions[index, None]), ent if need_entropy else None

    rewards = (actions % 2 == 0).float()
    batch = UpdateBatch.build(config.advantage, rewards=rewards, group_ids=states,
                              mask=torch.ones(len(states), 1))  # fmt: skip
    optimizer = torch.optim.SGD([logits], lr=0.5)
    metrics = policy_update(control, batch, score=score, backward=torch.Tensor.backward,
                            step=lambda: optimizer.step() or True,
                            zero_grad=optimizer.zero_grad)  # fmt: skip
    if estimator == "sampled":
        expected = sampled_entropy(batch.old_logprobs, batch.mask)
    else:
        expected = float(-(start.exp() * start).sum(-1).mean())
    assert control.target == pytest.approx(expected) == metrics["entropy_tracked"]
    assert metrics["entropy"] == sampled_entropy(batch.old_logprobs, batch.mask)
    # the first loss's scores are the first iteration's entropy: every later loss is told the
    # target (the first one acts as the entropy bonus)
    assert seen == [None] + [control.target] * 3
    assert metrics["optimizer_steps"] == 4


def test_a_negative_penalty_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^algo.lever.penalty must be >= 0, got -1"):
        build_algorithm({"name": "grpo", "lever": {"name": "entropy-constraint", "penalty": -1}})


def test_entropy_exact_is_the_sampling_policys_mean_entropy_over_the_batch():
    """Where the lever computes entropies, the update reports the exact mean token entropy of
    the policy that sampled the batch (every row scored before the first step), by hand here."""
    torch.manual_seed(2)
    logits = torch.nn.Parameter(torch.randn(4, 5))
    states = torch.arange(4).repeat_interleave(3)
    actions = torch.multinomial(torch.softmax(logits.detach(), -1)[states], 1).flatten()
    logp0 = torch.log_softmax(logits.detach(), -1)
    expected = float((-(logp0.exp() * logp0).sum(-1))[states].mean())
    for lever, present in (("entropy-constraint", True), ("none", False)):
        config = build_algorithm({"name": "grpo", "lever": lever, "epochs": 1,
                                  "minibatch_size": 4})  # fmt: skip
        weights = torch.nn.Parameter(logits.detach().clone())

        def score(index, need_entropy, weights=weights):
            logp = torch.log_softmax(weights[states[index]], -1)
            ent = -(logp.exp() * logp).sum(-1, keepdim=True)
            return logp.gather(1, actions[index, None]), ent if need_entropy else None

        batch = UpdateBatch.build(config.advantage, rewards=(actions % 2).float(),
                                  group_ids=states, mask=torch.ones(len(states), 1))  # fmt: skip
        optimizer = torch.optim.SGD([weights], lr=1.0)
        metrics = policy_update(EntropyControl(config), batch, score=score,
                                backward=torch.Tensor.backward,
                                step=lambda opt=optimizer: opt.step() or True,
                                zero_grad=optimizer.zero_grad)  # fmt: skip
        assert metrics["optimizer_steps"] == 3  # the policy moved between minibatches
        if present:
            assert metrics["entropy_exact"] == pytest.approx(expected, rel=1e-6)
        else:
            assert metrics["entropy_exact"] is None


def test_a_target_from_several_iterations_is_their_mean_and_nothing_moves_before_it():
    config = build_algorithm({"name": "grpo", "lever": "entropy-constraint",
                              "controller": {"target_iterations": 3, "target": 0.9}})  # fmt: skip
    control = EntropyControl(config)
    start = control.coefficient
    for entropy in (2.0, 2.6):
        control.reference(entropy)
        control.observe_step(0.1)  # far below any target: a moving controller would move
        control.observe(entropy)
        assert control.target is None
        assert control.coefficient == start
    control.observe(1.9)
    assert control.target == pytest.approx(0.9 * (2.0 + 2.6 + 1.9) / 3)
    control.observe_step(0.1)
    assert control.coefficient > start
    with pytest.raises(ValueError, match="target_iterations must be an integer >= 1, got 0"):
        build_algorithm({"name": "grpo", "lever": "entropy-constraint",
                         "controller": {"target_iterations": 0}})  # fmt: skip


def test_iterations_before_a_late_target_are_judged_against_it():
    from entrogym.train.evaluation.target_tracking import filled_targets, max_excursion

    entropy = [2.0, 2.6, 1.9, 2.1]
    assert filled_targets([None, None, 2.0, 2.0], entropy) == [2.0] * 4
    assert filled_targets([None] * 4, entropy) == [2.0] * 4  # no controller: the first entropy
    assert max_excursion(
        entropy, filled_targets([None, None, 2.0, 2.0], entropy), 0
    ) == pytest.approx(0.3)


@pytest.mark.parametrize(("excess", "slack", "beta_penalty"),
                         [(0.5, float("inf"), 0.0), (0.5, 0.2, -0.3), (0.1, 0.2, 0.0),
                          (-0.3, 0.2, 0.3)])  # fmt: skip
def test_the_upper_slack_tolerates_an_excess_and_never_softens_the_push_below(
    excess, slack, beta_penalty
):
    """H = (1 + excess) H*: above the target only the excess past the slack pulls down (none
    with slack inf, the one-sided constraint); below it the push is as without slack. The
    gradient is by hand: an entropy bonus of (penalty * e) with e the clipped shortfall."""
    mask = torch.ones(2, 3, dtype=torch.float64)
    target = 2.0
    ent = torch.full((2, 3), target * (1 + excess), dtype=torch.float64, requires_grad=True)
    loss = entropy_constraint_loss(ent, mask, 0.0, target, 1.0, slack)
    (grad,) = torch.autograd.grad(loss, ent)
    torch.testing.assert_close(grad, -beta_penalty * mask / 6, rtol=1e-9, atol=1e-12)
