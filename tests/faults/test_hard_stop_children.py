"""A stop past ``--shutdown-grace`` exits without running any ``close``: it must still end the
process's children (an in-process vLLM's engine core and worker, env workers that ignore
SIGTERM), which would otherwise outlive the run holding the model's memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from entrogym.train.shutdown import descendants

# A "trainer" that starts a child and a grandchild, both ignoring SIGTERM (as env workers do),
# then blocks past its grace period with the handlers armed.
STUCK_RUN = textwrap.dedent(
    """
    import subprocess, sys, time
    from entrogym.train.shutdown import ShutdownRequest

    IGNORING = ("import signal, subprocess, sys, time; "
                "signal.signal(signal.SIGTERM, signal.SIG_IGN); {}; time.sleep(600)")
    grandchild = IGNORING.format("pass")
    child = IGNORING.format(f"subprocess.Popen([sys.executable, '-c', {grandchild!r}])")
    subprocess.Popen([sys.executable, "-c", child])
    with ShutdownRequest(grace_s=1.0):
        print("armed", flush=True)
        time.sleep(600)  # never reaches a safe point
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent has not reaped it


def test_a_stop_past_the_grace_period_ends_the_runs_children() -> None:
    run = subprocess.Popen([sys.executable, "-c", STUCK_RUN], stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout is not None and run.stdout.readline().strip() == "armed"
        deadline = time.monotonic() + 30
        while len(descendants(run.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        family = descendants(run.pid)
        assert len(family) == 2, family  # the child and the grandchild are running
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while any(map(_alive, family)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, family)), [p for p in family if _alive(p)]
    finally:
        run.kill()
        for pid in descendants(run.pid):
            os.kill(pid, signal.SIGKILL)


def test_descendants_lists_a_process_tree_parents_first() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert sleeper.pid in descendants(os.getpid())
        assert descendants(sleeper.pid) == []
    finally:
        sleeper.kill()
        sleeper.wait()
