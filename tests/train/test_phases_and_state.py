"""The phase clock every train row's ``phases_s`` comes from, and ``TrainState``."""

from __future__ import annotations

import time

import pytest

from entrogym.train.folder.state import TrainState
from entrogym.train.phases import PHASES, PhaseClock


def test_phase_clock_sums_per_phase_and_calls_hooks_with_the_blocks_info():
    seen = []
    clock = PhaseClock(hooks=(lambda phase, s, info: seen.append((phase, s, info)),))
    with clock.time("forward", rows=3):
        time.sleep(0.01)
    clock.add("forward", 0.5)
    clock.add("generation", 2.0, note="x")
    taken = clock.take()
    assert set(taken) == set(PHASES)
    assert taken["forward"] >= 0.51 and taken["generation"] == 2.0 and taken["backward"] == 0
    assert [p for p, _, _ in seen] == ["forward", "forward", "generation"]
    assert seen[0][2] == {"rows": 3} and seen[2][2] == {"note": "x"}
    assert clock.take()["forward"] == 0  # take() starts the next iteration's tally
    with pytest.raises(ValueError, match="unknown phase 'fwd'"):
        clock.add("fwd", 1.0)


def test_phase_clock_calls_start_hooks_before_the_block_runs():
    events: list[tuple[str, str]] = []
    clock = PhaseClock()
    clock.watch(lambda phase: events.append(("start", phase)),
                lambda phase, s, info: events.append(("end", phase)))  # fmt: skip
    with clock.time("backward"):
        events.append(("body", "backward"))
    clock.add("generation", 1.0)  # measured elsewhere: only the end hook
    assert events == [("start", "backward"), ("body", "backward"), ("end", "backward"),
                      ("end", "generation")]  # fmt: skip


def test_train_state_round_trips_and_reads_older_checkpoints():
    state = TrainState(iteration=4, cumulative_entropy=2.5, bad_steps=1, best=0.5,
                       control={"zeta": 0.1}, metrics_rows=7, algo="repo-r")  # fmt: skip
    assert TrainState.from_dict(state.to_dict()) == state and state.start == 5
    # a checkpoint of an older version: fewer keys, and keys this version does not know
    old = {"iteration": 2, "cumulative_entropy": 1.0, "bad_steps": 0, "best": -1.0,
           "control": {}, "metrics_rows": 3, "algo": "grpo", "retired_key": 1}  # fmt: skip
    assert TrainState.from_dict(old).start == 3
    assert TrainState().start == 0
