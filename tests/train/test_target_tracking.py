"""tracking_error and max_excursion: the deviation |H_t / H*_t - 1| summarised."""

from __future__ import annotations

import pytest

from entrogym.train.evaluation.target_tracking import deviations, max_excursion, tracking_error


def test_tracking_error_is_the_mean_deviation_over_the_second_half():
    entropy = [2.0, 1.0, 2.2, 1.8, 2.0]  # second half: iterations 2..4
    assert deviations(entropy, 2.0) == pytest.approx([0.0, 0.5, 0.1, 0.1, 0.0])
    assert tracking_error(entropy, 2.0) == pytest.approx((0.1 + 0.1 + 0.0) / 3)
    assert max_excursion(entropy, 2.0) == pytest.approx(0.1)  # second half by default
    assert max_excursion(entropy, 2.0, start=1) == pytest.approx(0.5)  # from the 2nd iteration


def test_targets_may_change_per_iteration_and_must_match():
    assert deviations([1.0, 3.0], [2.0, 2.0]) == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError, match="2 entropies but 1 targets"):
        deviations([1.0, 2.0], [1.0])
