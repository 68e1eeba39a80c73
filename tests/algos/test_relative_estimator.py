"""``controller.estimator relative``: the batch's exact entropy over the base model's on the same
tokens. The formula against plain-Python softmax entropies, its spread for a fixed policy against
the exact batch mean's, the control's feedback, the bandit lab's, and the learner's two passes on
a tiny LoRA model against entropies computed from the model's own logits."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from entrogym.algos import (
    ControllerParams,
    EntropyControl,
    UpdateBatch,
    build_algorithm,
    exact_batch_entropy,
    policy_update,
    relative_entropy,
)
from entrogym.experiments.lab import run_one
from entrogym.experiments.lab_config import LabConfig


def _hand_entropy(logits: list[float]) -> float:
    z = sum(math.exp(x) for x in logits)
    return -sum(math.exp(x) / z * (x - math.log(z)) for x in logits)


def test_relative_entropy_is_the_ratio_of_hand_softmax_entropies_over_the_masked_tokens():
    policy = [[[2.0, 0.5, -1.0], [0.0, 0.1, 0.2]], [[-3.0, 3.0, 0.0], [1.0, 1.0, 1.0]]]
    base = [[[1.0, 0.5, 0.0], [0.3, -0.1, 0.2]], [[-1.0, 1.0, 0.0], [4.0, 0.0, 0.0]]]
    mask = [[1.0, 1.0], [1.0, 0.0]]
    kept = [(b, t) for b in range(2) for t in range(2) if mask[b][t]]
    expected = sum(_hand_entropy(policy[b][t]) for b, t in kept) / sum(
        _hand_entropy(base[b][t]) for b, t in kept
    )

    def entropies(logits):
        return torch.tensor([[_hand_entropy(row) for row in seq] for seq in logits])

    got = relative_entropy(entropies(policy), entropies(base), torch.tensor(mask))
    assert got == pytest.approx(expected, rel=1e-6)
    assert relative_entropy(entropies(base), entropies(base), torch.tensor(mask)) == 1.0
    with pytest.raises(ValueError, match="no action tokens"):
        relative_entropy(entropies(policy), entropies(base), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="entropy 0"):
        relative_entropy(entropies(policy), torch.zeros(2, 2), torch.tensor(mask))
    with pytest.raises(ValueError, match="shape of mask"):
        relative_entropy(entropies(policy), torch.zeros(3, 2), torch.tensor(mask))


def test_for_a_fixed_trained_policy_the_ratio_spreads_less_than_the_batch_mean():
    """Batches of one fixed policy, sharpened from a base whose states differ widely in entropy,
    with the states themselves drawn (as an LLM's prefixes are): the batch's exact mean moves
    with which states were drawn, the ratio to the base on the same states far less."""
    g = torch.Generator().manual_seed(3)
    base_logits = torch.randn(12, 8, generator=g) * torch.linspace(0.2, 4.0, 12)[:, None]
    trained = 1.5 * base_logits + 0.3 * torch.randn(12, 8, generator=g)

    def state_entropy(logits):
        logp = torch.log_softmax(logits, -1)
        return -(logp.exp() * logp).sum(-1)

    h, h_base = state_entropy(trained), state_entropy(base_logits)
    means, ratios = [], []
    for _ in range(400):
        states = torch.randint(0, 12, (16, 1), generator=g)
        mask = torch.ones(16, 1)
        means.append(exact_batch_entropy(h[states], mask))
        ratios.append(relative_entropy(h[states], h_base[states], mask))

    def spread(xs):
        return statistics.stdev(xs) / statistics.fmean(xs)

    assert spread(ratios) < 0.5 * spread(means), (spread(ratios), spread(means))
    # both centre on their population values (the ratio's is the ratio of the state means)
    assert statistics.fmean(ratios) == pytest.approx(float(h.mean() / h_base.mean()), rel=0.02)


def _relative_control(target: float = 1.0) -> EntropyControl:
    controller = {"estimator": "relative", "target": target}
    return EntropyControl(
        build_algorithm({"name": "repo-r", "minibatch_size": 4, "controller": controller})
    )


def _update(control: EntropyControl, needs_entropy: bool = False) -> dict:
    """One repo-r update of a 3-state tabular policy; the scorer counts entropy requests."""
    logits = torch.nn.Parameter(torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.1, 0.2], [-3.0, 3.0, 0.0]]))
    states = torch.arange(3).repeat_interleave(4)
    actions = torch.tensor([0, 1, 0, 2] * 3)
    asked = []

    def score(index, need_entropy):
        asked.append(need_entropy)
        logp = torch.log_softmax(logits[states[index]], -1)
        ent = -(logp.exp() * logp).sum(-1, keepdim=True) if need_entropy else None
        return logp.gather(1, actions[index, None]), ent

    batch = UpdateBatch.build(control.config.advantage, rewards=(actions == 0).float(),
                              group_ids=states, mask=torch.ones(12, 1))  # fmt: skip
    optimizer = torch.optim.SGD([logits], lr=0.5)
    metrics = policy_update(control, batch, score=score, backward=torch.Tensor.backward,
                            step=lambda: optimizer.step() or True,
                            zero_grad=optimizer.zero_grad)  # fmt: skip
    # repo-r's loss needs no entropies, and the ratio was handed over; a constraint's does
    assert any(asked) == needs_entropy
    return metrics


def test_the_relative_estimator_tracks_the_ratio_it_is_handed_against_target_times_the_first():
    control = _relative_control(target=0.5)
    assert control.tracks_relative and control.tracks_handed and control.measures_exact
    assert not control.tracks_probe_states and not control.needs_entropy
    control.observe_states(1.0, 2.0)  # a fresh adapter: the policy is the base model
    first = _update(control)
    assert first["entropy_tracked"] == 1.0 and control.target == 0.5
    assert first["entropy_error"] == pytest.approx(1.0)  # twice the target
    control.observe_states(0.4, 2.0)  # below the target: the paper's controller answers
    coefficient = control.coefficient
    second = _update(control)
    assert second["entropy_tracked"] == 0.4 and second["entropy_error"] == pytest.approx(-0.2)
    assert control.coefficient > coefficient
    with pytest.raises(ValueError, match="relative is measured by the caller"):
        _update(control)  # a stale measurement is not reused


def test_the_relative_estimator_needs_a_step_per_iteration_in_one_line():
    with pytest.raises(ValueError, match=r"set algo.controller.step iteration$"):
        ControllerParams(estimator="relative", step="optimizer")
    assert ControllerParams(estimator="relative").target_probe == 0  # no probe needed


def test_the_lab_feeds_the_mean_state_entropy_over_the_initial_policys():
    config = build_algorithm({"name": "repo-r", "controller": {"estimator": "relative"}})
    lab = LabConfig(iters=4, n_states=8, n_arms=8, samples_per_state=8)
    initial, rows = run_one(config, 0, lab)
    assert rows[0]["entropy_tracked"] == pytest.approx(1.0, abs=1e-12)
    for before, row in zip(rows, rows[1:], strict=False):
        # iteration i tracks the policy after update i - 1, whose entropy ``before`` logged
        assert row["entropy_tracked"] == pytest.approx(before["entropy"] / initial["entropy"])
    assert rows[-1]["entropy_tracked"] != 1.0


def test_a_lever_reads_the_ratio_target_in_nats_on_the_batch():
    """The entropy-constraint lever's in-loss push compares a micro-batch's exact entropy (nats)
    with its target: under ``relative`` that is the ratio target times the base model's mean
    entropy on the iteration's batch, handed over with the ratio."""
    config = build_algorithm({"name": "grpo", "minibatch_size": 4, "lever": "entropy-constraint",
                              "controller": {"name": "pi", "estimator": "relative", "target": 0.5,
                                             "step": "iteration"}})  # fmt: skip
    control = EntropyControl(config)
    seen = []
    extra_loss = control.lever.extra_loss

    def recording(*args, **kwargs):
        seen.append(kwargs["target"])
        return extra_loss(*args, **kwargs)

    control.lever.extra_loss = recording
    with pytest.raises(ValueError, match="base model's mean entropy"):
        control.observe_states(1.0)
    control.observe_states(1.0, 1.8)
    assert control.lever_target is None  # the target is set from the first ratio, in the update
    _update(control, needs_entropy=True)
    assert seen and all(t == pytest.approx(0.5 * 1.8) for t in seen[1:])
    control.observe_states(0.8, 1.2)  # another batch: the same ratio target, other nats
    seen.clear()
    _update(control, needs_entropy=True)
    assert seen and all(t == pytest.approx(0.5 * 1.2) for t in seen)
    assert control.lever_target is None  # read outside an update: no batch to convert on
