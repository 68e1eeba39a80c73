"""What the controller tracks (``controller.estimator``): the exact mean token entropy or the
sampled surprisal, against hand computations in plain Python."""

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
    sampled_entropy,
)

LOGITS = [[2.0, 0.5, -1.0], [0.0, 0.1, 0.2], [-3.0, 3.0, 0.0]]  # 3 states x a vocab of 3


def _hand_entropy(logits: list[float]) -> float:
    """-sum_v p(v) log p(v) of softmax(logits), by hand."""
    z = sum(math.exp(x) for x in logits)
    return -sum(math.exp(x) / z * (x - math.log(z)) for x in logits)


def _hand_logprob(logits: list[float], v: int) -> float:
    return logits[v] - math.log(sum(math.exp(x) for x in logits))


def test_exact_batch_entropy_is_the_hand_softmax_entropy_over_the_masked_tokens():
    states = [[0, 1, 2], [2, 2, 0]]
    mask = [[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]]
    logits = torch.tensor(LOGITS, dtype=torch.float64)
    token_entropies = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    entropies = token_entropies[torch.tensor(states)]
    kept = [states[b][t] for b in range(2) for t in range(3) if mask[b][t]]
    expected = sum(_hand_entropy(LOGITS[s]) for s in kept) / len(kept)
    assert exact_batch_entropy(entropies, torch.tensor(mask)) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="no action tokens"):
        exact_batch_entropy(entropies, torch.zeros(2, 3))


def _tabular_update(estimator: str, supply_old: bool, control: EntropyControl | None = None):
    """One repo-r update of a 3-state tabular policy (a batch of 12 one-token rows); the
    scorer returns each row's exact entropy. Returns the control, the metrics and the hand
    exact and sampled means of the batch, and the rows of each score call asked for entropies."""
    g = torch.Generator().manual_seed(5)
    logits = torch.nn.Parameter(torch.tensor(LOGITS, dtype=torch.float64))
    states = torch.arange(3).repeat_interleave(4)
    actions = torch.multinomial(torch.softmax(logits.detach(), -1)[states], 1, generator=g)
    actions = actions.flatten()
    asked: list[int] = []  # rows of each score call asked for entropies (0: not asked)

    def score(index, need_entropy):
        asked.append(len(index) if need_entropy else 0)
        logp = torch.log_softmax(logits[states[index]], -1)
        ent = -(logp.exp() * logp).sum(-1, keepdim=True) if need_entropy else None
        return logp.gather(1, actions[index, None]), ent

    if control is None:
        config = build_algorithm(
            {"name": "repo-r", "minibatch_size": 4, "controller": {"estimator": estimator}}
        )
        control = EntropyControl(config)
    config = control.config
    old = score(torch.arange(12), False)[0].detach() if supply_old else None
    asked.clear()
    batch = UpdateBatch.build(config.advantage, rewards=(actions == 0).double(),
                              group_ids=states, mask=torch.ones(12, 1),
                              old_logprobs=old)  # fmt: skip
    optimizer = torch.optim.SGD([logits], lr=0.5)
    metrics = policy_update(control, batch, score=score, backward=torch.Tensor.backward,
                            step=lambda: optimizer.step() or True,
                            zero_grad=optimizer.zero_grad)  # fmt: skip
    rows = list(zip(states.tolist(), actions.tolist(), strict=True))
    exact = sum(_hand_entropy(LOGITS[s]) for s, _ in rows) / len(rows)
    sampled = -sum(_hand_logprob(LOGITS[s], a) for s, a in rows) / len(rows)
    return control, metrics, exact, sampled, asked


@pytest.mark.parametrize("supply_old", [False, True])
def test_the_controller_sees_the_exact_mean_when_it_tracks_the_exact_entropy(supply_old):
    control, metrics, exact, sampled, asked = _tabular_update("exact", supply_old)
    assert exact != pytest.approx(sampled, rel=1e-3)  # the two differ on this batch
    # each row's entropy is asked for once, before the first step; the loss passes need none
    assert sum(asked) == 12 and len(asked) > sum(a > 0 for a in asked)
    assert control.needs_entropy  # repo-r's lever needs none: the controller asks for them
    assert control.controller.last_entropy == pytest.approx(exact, rel=1e-9)
    assert control.target == pytest.approx(exact, rel=1e-9)
    assert metrics["entropy_tracked"] == pytest.approx(exact, rel=1e-9)
    assert metrics["entropy_exact"] == pytest.approx(exact, rel=1e-9)
    assert metrics["entropy"] == pytest.approx(sampled, rel=1e-9)  # still the surprisal
    assert metrics["entropy_error"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("supply_old", [False, True])
def test_the_controller_sees_the_sampled_mean_when_asked(supply_old):
    control, metrics, exact, sampled, asked = _tabular_update("sampled", supply_old)
    assert not control.needs_entropy and not any(asked)  # the paper's costs no entropy pass
    assert control.controller.last_entropy == pytest.approx(sampled, rel=1e-9)
    assert control.target == pytest.approx(sampled, rel=1e-9)
    assert metrics["entropy_tracked"] == metrics["entropy"] == pytest.approx(sampled, rel=1e-9)
    assert metrics["entropy_exact"] is None


def test_the_default_estimator_is_exact_and_a_wrong_one_is_refused_in_one_line():
    assert ControllerParams().estimator == "exact"
    for preset in ("repo-r", "repo-d", "adapo", "grpo-entropy-bonus"):
        control = EntropyControl(build_algorithm(preset))
        assert control.tracks_exact and control.needs_entropy, preset
    grpo = EntropyControl(build_algorithm("grpo"))  # no controller: nothing tracked, no pass
    assert not grpo.tracks_exact and not grpo.needs_entropy
    with pytest.raises(ValueError, match=r"^algo.controller.estimator: expected one of exact"):
        build_algorithm({"name": "repo-r", "controller": {"estimator": "mean"}})
    with pytest.raises(
        ValueError,
        match=r"^algo.controller.estimator must be exact, sampled, probe, relative or input_dependence",
    ):
        ControllerParams(estimator="mean")


def test_batch_entropy_needs_the_entropies_it_tracks():
    control = EntropyControl(build_algorithm("repo-r"))
    logprobs, mask = torch.tensor([[-1.0, -2.0]]), torch.ones(1, 2)
    assert control.batch_entropy(logprobs, torch.tensor([[0.5, 0.7]]), mask) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="need_entropy=True"):
        control.batch_entropy(logprobs, None, mask)
    sampled = EntropyControl(
        build_algorithm({"name": "repo-r", "controller": {"estimator": "sampled"}})
    )
    assert sampled.batch_entropy(logprobs, None, mask) == pytest.approx(1.5)


def test_for_a_fixed_policy_the_exact_estimate_spreads_less_than_the_surprisal():
    """Batches of one fixed tabular policy whose states are themselves drawn (as an LLM's
    prefixes are): both estimates have the same mean, the exact one a smaller variance (it is
    the surprisal's conditional expectation given the states)."""
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(8, 6, generator=g) * 2.0  # states of very different entropy
    logp = torch.log_softmax(logits, -1)
    state_entropy = -(logp.exp() * logp).sum(-1)
    exact, sampled = [], []
    for _ in range(300):
        states = torch.randint(0, 8, (16,), generator=g)
        actions = torch.multinomial(logp[states].exp(), 1, generator=g)
        mask = torch.ones(16, 1)
        sampled.append(sampled_entropy(logp[states].gather(1, actions), mask))
        exact.append(exact_batch_entropy(state_entropy[states][:, None], mask))
    assert statistics.variance(exact) < 0.6 * statistics.variance(sampled)
    stderr = math.sqrt(statistics.variance(sampled) / len(sampled))
    assert abs(statistics.fmean(exact) - statistics.fmean(sampled)) < 3 * stderr


def _probe_control() -> EntropyControl:
    controller = {"estimator": "probe", "target_probe": 1}
    return EntropyControl(
        build_algorithm({"name": "repo-r", "minibatch_size": 4, "controller": controller})
    )


def test_the_probe_estimator_tracks_the_states_entropy_it_is_handed_and_costs_the_batch_nothing():
    control = _probe_control()
    assert control.tracks_probe_states and control.measures_exact
    assert not control.tracks_exact and not control.needs_entropy  # repo-r's loss needs none
    h0 = 1.2345  # the probe batch's entropy, and the fixed states' before any update
    control.observe_probe([h0])
    control.observe_states(h0)
    _, first, exact, sampled, asked = _tabular_update("probe", False, control)
    assert not any(asked)  # the batch pays no entropy pass for the controller
    assert first["entropy_tracked"] == h0 and control.target == pytest.approx(h0, rel=1e-12)
    assert first["entropy"] == pytest.approx(sampled, rel=1e-9) and exact != h0
    coefficient = control.coefficient
    control.observe_states(0.8 * h0)  # the states' entropy fell by 20 %: the controller answers
    _, second, _, _, _ = _tabular_update("probe", False, control)
    assert control.controller.last_entropy == pytest.approx(0.8 * h0, rel=1e-12)
    assert second["entropy_error"] == pytest.approx(-0.2, rel=1e-9)
    assert control.coefficient > coefficient  # below target: the paper's controller doubles
    with pytest.raises(ValueError, match="observe_states"):  # a stale measurement is not reused
        _tabular_update("probe", False, control)


def test_the_probe_estimator_refuses_an_update_it_was_not_handed_states_for():
    with pytest.raises(ValueError, match="observe_states"):
        _tabular_update("probe", False, _probe_control())


def test_the_probe_estimator_needs_probe_batches_and_a_step_per_iteration():
    with pytest.raises(ValueError, match=r"set algo.controller.target_probe 1 or more$"):
        ControllerParams(estimator="probe")
    with pytest.raises(ValueError, match=r"set algo.controller.step iteration$"):
        ControllerParams(estimator="probe", target_probe=2, step="optimizer")


def test_the_control_asks_for_its_probe_batches_once_before_any_iteration():
    """``probe_request``: the trainer reads how many probe batches to draw from the control,
    which alone reads ``controller.target_probe``; none once an iteration was observed (a
    resumed run's state) and none without a target."""
    config = build_algorithm({"name": "repo-d", "controller": {"name": "pi", "target_probe": 3}})
    control = EntropyControl(config)
    assert control.probe_request == 3
    control.observe_probe([1.0, 1.2, 1.1])
    control.observe(1.3)
    assert control.probe_request == 0
    resumed = EntropyControl(config)
    resumed.load_state_dict(control.state_dict())
    assert resumed.probe_request == 0
    assert EntropyControl(build_algorithm("grpo")).probe_request == 0
    assert EntropyControl(build_algorithm("repo-d")).probe_request == 0
