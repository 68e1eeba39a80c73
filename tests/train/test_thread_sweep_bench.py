"""benchmarks/thread_sweep.py: the Amdahl fit through its two points, its clamps, and the
projected iterations against sums worked by hand on made-up phase timings."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import thread_sweep  # noqa: E402


def test_the_fit_passes_through_both_timings() -> None:
    serial, parallel = thread_sweep.amdahl_fit(10.0, 6.0)
    assert (serial, parallel) == (2.0, 8.0)
    assert thread_sweep.phase_seconds((serial, parallel), 1) == 10.0
    assert thread_sweep.phase_seconds((serial, parallel), 2) == 6.0
    assert thread_sweep.phase_seconds((serial, parallel), 4) == 4.0


@pytest.mark.parametrize(
    ("t1", "t2", "fit"),
    [(5.0, 6.0, (5.0, 0.0)), (10.0, 4.0, (0.0, 10.0)), (3.0, 3.0, (3.0, 0.0))],
)
def test_a_phase_that_slowed_is_serial_and_one_that_more_than_halved_is_parallel(
    t1: float, t2: float, fit: tuple[float, float]
) -> None:
    assert thread_sweep.amdahl_fit(t1, t2) == fit


def _reports() -> tuple[dict, dict]:
    # generation: all parallel (12 s on 1 thread); env: all serial; the learner: 2 s serial,
    # 16 s parallel
    one = {"generation": 12.0, "env": 1.0, "forward": 10.0, "backward": 8.0}
    two = {"generation": 6.0, "env": 1.0, "forward": 6.0, "backward": 4.0}

    def report(threads: int, phases: dict) -> dict:
        return {"entrogym": {
            "threads": threads, "phases_s": phases, "repetitions": [],
            "median_seconds_per_iteration": sum(phases.values()),
            "generated_tokens_per_iteration": 1200,
            "generation_roofline": {"byte_bound_tokens_per_s": 600.0},
        }}  # fmt: skip

    return report(1, one), report(2, two)


def test_the_projection_against_hand_sums() -> None:
    result = thread_sweep.sweep(*_reports())
    by_cores = {row["cores"]: row for row in result["projection"]}
    # sync on 4: generation 12/4 + env 1 + learner 2 + 16/4
    assert by_cores[4]["sync_s"] == pytest.approx(3 + 1 + 2 + 4)
    assert by_cores[1]["sync_s"] == pytest.approx(31.0)
    # async on 4, every split worked out: r=1: max(13, 2+16/3), r=2: max(7, 10), r=3: max(5, 18)
    assert by_cores[4]["async_best_split"] == [2, 2]
    assert by_cores[4]["async_best_s"] == pytest.approx(10.0)
    # the cost split from 1-thread core-seconds (13 rollout, 18 learner): 13/2 against 18/2
    # beats 13/1 against 18/3 and 13/3 against 18/1 in balanced_split's even-division model
    assert by_cores[4]["async_cost_split"] == [2, 2]
    assert by_cores[4]["async_cost_s"] == pytest.approx(10.0)
    assert by_cores[4]["async_cost_vs_sync"] == pytest.approx(10.0 / 10.0)
    # on 16: learner 2 + 16/l against rollout 1 + 12/r; the best of the 15 splits by brute force
    best = min(range(1, 16), key=lambda r: max(1 + 12 / r, 2 + 16 / (16 - r)))
    assert by_cores[16]["async_best_split"] == [best, 16 - best]


def test_the_elastic_split_against_hand_sums() -> None:
    """Even shares while both sides run, then the update's remaining work on every core."""
    by_cores = {row["cores"]: row for row in thread_sweep.sweep(*_reports())["projection"]}
    # on 2: rollout 13 s on 1 thread beside the update's 18 s on 1 thread (13/18 of it done),
    # the other 5/18 on 2 threads (2 + 16/2 = 10 s for all of it)
    assert by_cores[2]["async_elastic_split"] == [1, 1]
    assert by_cores[2]["async_elastic_s"] == pytest.approx(13 + (1 - 13 / 18) * 10, abs=0.01)
    sync = by_cores[2]["sync_s"]
    assert by_cores[2]["async_elastic_vs_sync"] == pytest.approx(sync / (13 + 50 / 18), abs=1e-3)
    # on 4: rollout 1 + 12/2 = 7 s, the update 2 + 16/2 = 10 s on 2, then 2 + 4 = 6 s on 4
    assert by_cores[4]["async_elastic_s"] == pytest.approx(7 + (1 - 7 / 10) * 6, abs=0.01)
    # an update shorter than the rollouts waits for them: the iteration is the rollout side
    fast = thread_sweep.fits(
        {"generation": 40.0, "forward": 2.0}, {"generation": 20.0, "forward": 1.0}
    )
    assert thread_sweep.project(fast, 2)["async_elastic_s"] == pytest.approx(40.0)


def test_the_read_floor_holds_generation_up() -> None:
    result = thread_sweep.sweep(*_reports())
    assert result["generation_floor_s"] == pytest.approx(2.0)  # 1200 tokens at 600 tokens/s
    floored = {row["cores"]: row for row in result["projection_with_floor"]}
    free = {row["cores"]: row for row in result["projection"]}
    # on 16 threads generation would take 12/16 s; the floor keeps it at 2 s
    assert floored[16]["sync_s"] - free[16]["sync_s"] == pytest.approx(2.0 - 12 / 16)
    assert floored[2]["sync_s"] == free[2]["sync_s"]  # 6 s is above the floor
    assert "| 16 |" in thread_sweep.table(result)
