"""A real ``entrogym train`` process on the tiny model, started as a scheduler starts a job (in
a process group of its own), with an optional fault injected from inside at a named moment, so
that it lands there and nowhere else however loaded the machine is.

``fault`` (:func:`start_train`) is one of:

- ``kill-in-save:N``: SIGKILL of the trainer alone right after the N-th checkpoint's files are
  written and fsynced, before the folder is renamed into place;
- ``term-at-startup``: SIGTERM to the group as the policy starts loading;
- ``term-at-worker-start:N``: SIGTERM to the group right after the N-th worker process
  started (it is still importing its modules);
- ``term-in-rollouts:N``: SIGTERM to the group at the N-th env step of the process;
- ``term-in-update:I``: SIGTERM to the group as iteration I's update starts;
- ``term-in-save``: SIGTERM to the group inside the first checkpoint save (files written and
  fsynced, folder not yet renamed);
- ``int-twice-in-update:I``: SIGINT to the group twice as iteration I's update starts (Ctrl-C
  twice). In an async run the rollout thread is then inside torch ops (it collects iteration
  I + 1, with a few seconds of matrix products first), as it is on a real model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def start_train(
    out: Path, settings: dict[str, Any], iterations: int, *, resume: bool = False, fault: str = ""
) -> subprocess.Popen:
    """``entrogym train --out OUT --iterations ITERATIONS`` with ``settings`` as options."""
    from vowel_env import option_words

    args = ["train", "--out", str(out), "--iterations", str(iterations)]
    args += option_words(settings)
    if resume:
        args += ["--resume", "true"]
    pythonpath = os.pathsep.join(str(p) for p in (REPO, REPO / "tests", REPO / "tests" / "faults"))
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": pythonpath, "ENTROGYM_TEST_FAULT": fault},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _to_group(sig: int) -> None:
    os.killpg(os.getpgid(0), sig)


def _on_call(owner: Any, name: str, when: Any, act: Any, after: bool = False) -> None:
    """Wrap ``owner.name``: ``act()`` before (or ``after``) the calls for which
    ``when(*args)`` is true."""
    real = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        hit = when(*args, **kwargs)
        if hit and not after:
            act(*args)
        result = real(*args, **kwargs)
        if hit and after:
            act(*args)
        return result

    setattr(owner, name, wrapped)


def _nth(n: int) -> Any:
    calls = [0]

    def when(*args: Any, **kwargs: Any) -> bool:
        calls[0] += 1
        return calls[0] == n

    return when


def _inject(fault: str) -> None:
    from entrogym.agents.env_workers import RemoteEnv
    from entrogym.train.folder import checkpoint
    from entrogym.train.learner.update import Learner
    from entrogym.train.sampler.engine import Sampler
    from entrogym.workers import WorkerProcess

    kind, _, arg = fault.partition(":")
    term = lambda *args: _to_group(signal.SIGTERM)  # noqa: E731
    if kind == "kill-in-save":
        kill = lambda *args: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
        _on_call(checkpoint, "_fsync_tree", _nth(int(arg)), kill, after=True)
    elif kind == "term-in-save":
        _on_call(checkpoint, "_fsync_tree", _nth(1), term, after=True)
    elif kind == "term-at-startup":
        _on_call(Learner, "__init__", _nth(1), term)
    elif kind == "term-at-worker-start":
        _on_call(WorkerProcess, "__init__", _nth(int(arg)), term, after=True)
    elif kind == "term-in-rollouts":
        _on_call(RemoteEnv, "step", _nth(int(arg)), term)
    elif kind == "term-in-update":
        _on_call(Learner, "update", lambda self, control, batch, it: it == int(arg), term)
    elif kind == "int-twice-in-update":
        busy = threading.Event()

        def compute(self: Sampler, it: int, *args: Any, **kwargs: Any) -> None:
            import torch

            busy.set()
            a = torch.ones(1000, 1000)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                torch.mm(a, a)

        def in_thread(self: Sampler, it: int, *args: Any, **kwargs: Any) -> bool:
            return it == int(arg) + 1 and threading.current_thread() is not threading.main_thread()

        def ctrl_c_twice(self: Learner, *args: Any) -> None:
            if self.cfg.max_staleness:
                assert busy.wait(120), "the rollout thread did not start iteration I + 1"
            for _ in range(2):
                _to_group(signal.SIGINT)
                time.sleep(0.2)  # the handler runs for each: two signals, not one

        _on_call(Sampler, "collect", in_thread, compute)
        _on_call(Learner, "update", lambda self, control, batch, it: it == int(arg), ctrl_c_twice)
    elif fault:
        raise ValueError(f"unknown fault {fault!r}")


if __name__ == "__main__":
    import vowel_env  # noqa: F401  (registers test/Vowel-v0)

    _inject(os.environ.get("ENTROGYM_TEST_FAULT", ""))
    from entrogym.cli import main

    sys.exit(main(sys.argv[1:]))
