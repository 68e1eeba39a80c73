"""The job pool (``entrogym.experiments.pool``): a finished job's follow-ups start at once, results
come back in a fixed order, and jobs off the critical path run at a lower CPU priority.

The bodies sleep instead of training, so the timing is the pool's own. Where the order of two
jobs is the claim, the jobs wait for each other's files instead of sleeping a fixed time, so a
loaded machine's slow process start-up cannot reorder them."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import pytest

from entrogym.experiments.pool import BACKGROUND_NICE, run_jobs


def nap(job: tuple[str, float]) -> dict[str, Any]:
    """A job body: sleep ``job[1]`` seconds; say when, and at what niceness."""
    start = time.time()
    time.sleep(job[1])
    return {"name": job[0], "start": start, "end": time.time(), "nice": os.nice(0)}


def quiet(job: Any, result: dict[str, Any]) -> None:
    pass


def children(job: tuple[str, float], result: dict[str, Any]) -> list[tuple[str, float]]:
    """``fast`` is followed by two jobs, the first of them by one more; ``slow`` by none."""
    return {"fast": [("fast.1", 0.2), ("fast.2", 0.0)], "fast.1": [("fast.1.1", 0.0)]}.get(
        job[0], []
    )


@pytest.mark.parametrize("workers", [1, 3])
def test_follow_ups_come_back_after_the_jobs_in_their_parents_order(workers: int) -> None:
    results = run_jobs([("slow", 0.3), ("fast", 0.0)], workers, nap, quiet, then=children)
    assert [r["name"] for r in results] == ["slow", "fast", "fast.1", "fast.2", "fast.1.1"]


# How long the slow job waits for the follow-up's file: far longer than any process start-up,
# and the test fails when it runs out (the follow-up waited for the slow job).
WAIT_S = 120.0


def wait_or_mark(job: tuple[str, str]) -> dict[str, Any]:
    """A job body: ``slow`` runs until the file ``job[1]`` exists (at most WAIT_S seconds) and
    says whether it appeared; any other job writes that file."""
    start, marker = time.time(), Path(job[1])
    if job[0] == "slow":
        while not marker.exists() and time.time() < start + WAIT_S:
            time.sleep(0.05)
    else:
        marker.touch()
    return {"name": job[0], "start": start, "end": time.time(), "saw_marker": marker.exists()}


def test_a_follow_up_starts_before_the_slowest_first_job_ends(tmp_path: Path) -> None:
    marker = str(tmp_path / "follow-up-started")
    slow, fast, child = run_jobs(
        [("slow", marker), ("fast", marker + ".fast")], 3, wait_or_mark, quiet,
        then=lambda job, result: [("fast.1", marker)] if job[0] == "fast" else [],
    )  # fmt: skip
    # the slow job was still running when the follow-up started: it saw the follow-up's file
    assert slow["saw_marker"] and slow["end"] >= child["start"]
    assert child["start"] >= fast["end"]


def test_jobs_off_the_critical_path_run_at_a_lower_priority() -> None:
    base = os.nice(0)
    results = run_jobs([("held", 0.0), ("grpo", 0.0), ("fast", 0.0)], 2, nap, quiet,
                       then=children, urgent=lambda job: job[0] in ("held", "fast.1"))  # fmt: skip
    nice = {r["name"]: r["nice"] for r in results}
    low = min(19, base + BACKGROUND_NICE)
    assert nice == {"held": base, "grpo": low, "fast": low, "fast.1": base, "fast.2": low,
                    "fast.1.1": low}  # fmt: skip


def test_a_failing_follow_up_is_raised() -> None:
    def bad_children(job: tuple[str, float], result: dict[str, Any]) -> list[tuple[str, float]]:
        return [("boom", "not a number")] if job[0] == "fast" else []  # type: ignore[list-item]

    with pytest.raises(TypeError):
        run_jobs([("fast", 0.0)], 2, nap, quiet, then=bad_children)


POOL_SCRIPT = """
import sys, time
from entrogym.experiments.pool import run_jobs

def nap(job):
    time.sleep(job)
    return {}

if __name__ == "__main__":
    run_jobs([600.0, 600.0], 2, nap, lambda job, result: None)
"""


def test_sigterm_stops_the_pools_workers_too(tmp_path: Path) -> None:
    """A SIGTERM to the command (a scheduler's stop, ``kill``) ends its job processes as well,
    instead of leaving them running as orphans."""
    import signal
    import subprocess
    import sys

    import psutil

    script = tmp_path / "pool_main.py"
    script.write_text(POOL_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)])
    parent = psutil.Process(proc.pid)
    deadline = time.time() + WAIT_S
    workers: list[psutil.Process] = []
    try:
        while len(workers) < 2 and time.time() < deadline:  # the pool's two job processes
            workers = [c for c in parent.children() if "spawn_main" in " ".join(c.cmdline())]
            time.sleep(0.1)
        assert len(workers) == 2, "the pool's workers did not start"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        gone, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, f"job processes left running: {[p.pid for p in alive]}"
    finally:  # whatever failed, leave no sleeping job behind
        for p in [parent, *workers]:
            with contextlib.suppress(psutil.Error):
                p.kill()
