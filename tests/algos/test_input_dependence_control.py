"""``controller.estimator input_dependence``: a controller that tracks the mutual information of
task and response instead of an entropy. What it refuses, what the control asks of the caller,
and the bandit lab feeding it the exact information of state and arm."""

from __future__ import annotations

import pytest

from entrogym.algos import EntropyControl, build_algorithm
from entrogym.experiments.lab import run_one
from entrogym.experiments.lab_config import LabConfig


def _config(**controller):
    return build_algorithm(
        {"name": "repo-r", "controller": {"estimator": "input_dependence", **controller}}
    )


@pytest.mark.parametrize(
    ("algo", "message"),
    [
        ({"name": "repo-r", "controller": {"estimator": "input_dependence", "step": "optimizer"}},
         "step iteration"),
        ({"name": "repo-r", "controller": {"estimator": "input_dependence", "target_probe": 2}},
         "drop target_probe"),
        ({"name": "grpo", "lever": "entropy-constraint",
          "controller": {"estimator": "input_dependence", "step": "iteration"}},
         "reads no target"),
    ],
)  # fmt: skip
def test_what_cannot_track_input_dependence_is_refused(algo, message):
    with pytest.raises(ValueError, match=message):
        build_algorithm(algo)


def test_the_caller_hands_it_over_and_no_entropy_pass_is_paid_for_it():
    control = EntropyControl(_config())
    assert control.tracks_input_dependence and control.tracks_handed
    assert not control.measures_exact and not control.needs_entropy
    plain = EntropyControl(_config(estimator="relative"))
    assert not plain.tracks_input_dependence and plain.measures_exact


def test_the_lab_hands_the_controller_the_exact_information_of_state_and_arm():
    config = _config(target=0.5)
    lab = LabConfig(iters=4, n_states=6, n_arms=5, samples_per_state=8)
    _, rows = run_one(config, 0, lab)
    assert all(row["input_dependence"] > 0 for row in rows)
    for before, row in zip(rows, rows[1:], strict=False):
        # iteration i tracks the policy after update i - 1, whose information ``before`` logged
        assert row["entropy_tracked"] == pytest.approx(before["input_dependence"], rel=1e-12)
    # the target is half the first iteration's information, not an entropy
    assert rows[0]["entropy_target"] == pytest.approx(0.5 * rows[0]["entropy_tracked"])
    assert rows[0]["entropy_tracked"] != pytest.approx(rows[0]["entropy"], rel=1e-3)


def test_a_ratio_of_a_first_value_at_or_below_zero_is_refused():
    control = EntropyControl(_config())
    control.observe_states(-0.01)  # an estimate of an information near 0 can be negative
    with pytest.raises(ValueError, match="target_unit nats"):
        control.reference(-0.01)
    absolute = EntropyControl(_config(target_unit="nats", target=0.2))
    absolute.reference(-0.01)
    assert absolute.target == 0.2
