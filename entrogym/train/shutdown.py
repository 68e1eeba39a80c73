"""Stopping a run on SIGTERM or SIGINT without losing a completed iteration.

Schedulers send SIGTERM some time before they kill a job; Ctrl-C sends SIGINT. While a run
trains, :class:`ShutdownRequest` turns either signal into a request the trainer checks at safe
points: rollouts in progress are abandoned (the weights are still those of the last completed
iteration), an update in progress is finished, and the trainer then writes a checkpoint of
the last completed iteration and raises :class:`Interrupted`. The command prints "interrupted;
resume with --resume" and exits 128 + the signal's number (143 for SIGTERM, 130 for SIGINT).

If that takes longer than the grace period (``--shutdown-grace``, default 30 s), the process
exits anyway with the same code; the checkpoints already written stay intact (they are
written atomically), so at most the iterations since the last one are redone on resume. An
exit this abrupt skips every ``close``, so it first ends the process's own children (an
in-process vLLM's engine core and worker, env workers that ignore the signal), which would
otherwise outlive it holding the model's memory.

A second signal (Ctrl-C twice) stops at once: :class:`StopNow` is raised wherever the main
thread is, abandoning the step in progress (a checkpoint being written is removed again); the
trainer records the stop in the run's history and exits with the same code. A third signal
exits without any of that.

The handlers are armed from start-up on (the command arms them before its heavy imports), so a
signal that arrives while the model loads stops the run before its first iteration.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

HANDLED = (signal.SIGTERM, signal.SIGINT)


class Interrupted(Exception):
    """The run stopped on a signal after saving what it could; ``exit_code`` is 128 + the
    signal's number."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopNow(KeyboardInterrupt):
    """A second signal: stop at once. A KeyboardInterrupt, so that no ``except Exception`` on
    the way (an env's error handling, a retry loop) mistakes it for an error to carry on from."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class ShutdownRequest:
    """SIGTERM / SIGINT handlers for the life of a ``with`` block (in the main thread; in any
    other thread it changes nothing and never asks to stop). Blocks may nest: the outermost
    one arms and disarms."""

    def __init__(self, grace_s: float, prog: str = "entrogym train") -> None:
        self.grace_s, self.prog = grace_s, prog
        self.signum: int | None = None
        self.signals = 0  # how many arrived
        self._depth = 0
        self._previous: dict[int, Any] = {}
        self._timer: threading.Timer | None = None

    def __enter__(self) -> ShutdownRequest:
        self._depth += 1
        if self._depth == 1 and threading.current_thread() is threading.main_thread():
            for sig in HANDLED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth:
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._timer is not None:
            self._timer.cancel()

    def requested(self) -> bool:
        """Whether a signal asked the run to stop."""
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.signals == 2:
            print(f"{self.prog}: received {signal.Signals(signum).name} again; stopping now",
                  file=sys.stderr, flush=True)  # fmt: skip
            raise StopNow(self.signum or signum)
        if self.signals > 2:  # the stop itself hangs
            print(f"{self.prog}: stopping now. interrupted; resume with --resume",
                  file=sys.stderr, flush=True)  # fmt: skip
            end_children()
            os._exit(128 + (self.signum or signum))
        self.signum = signum
        print(
            f"{self.prog}: received {signal.Signals(signum).name}; stopping after the step in "
            f"progress and writing a checkpoint (within {self.grace_s:g} s, --shutdown-grace)",
            file=sys.stderr,
            flush=True,
        )
        self._timer = threading.Timer(self.grace_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        """The grace period ran out: exit now; the checkpoints on disk are intact."""
        assert self.signum is not None
        print(
            f"{self.prog}: no checkpoint within --shutdown-grace={self.grace_s:g} s; stopping "
            "now (the iterations since the last checkpoint will be redone). "
            "interrupted; resume with --resume",
            file=sys.stderr,
            flush=True,
        )
        end_children()
        os._exit(128 + self.signum)

    def interrupted(self, checkpoint: str | None) -> Interrupted:
        """The exception that ends the run, naming the checkpoint written."""
        assert self.signum is not None
        where = (
            f"checkpoint {checkpoint} holds every completed iteration"
            if checkpoint
            else ("no iteration had completed")
        )
        return Interrupted(self.signum, f"{signal.Signals(self.signum).name}: {where}")

    def stopped_now(self, checkpoint: str | None) -> Interrupted:
        """The exception that ends a run stopped by a second signal (:class:`StopNow`), naming
        the newest checkpoint on disk."""
        assert self.signum is not None
        where = (
            f"checkpoint {checkpoint} is the newest; the iterations after it will be redone"
            if checkpoint
            else "no checkpoint was written"
        )
        name = signal.Signals(self.signum).name
        return Interrupted(self.signum, f"{name}, then a second signal: stopped at once; {where}")


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs, read from ``/proc`` (Linux; elsewhere none),
    parents before their children."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # the process ended while being read
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def end_children(wait_s: float = 2.0) -> None:
    """SIGTERM this process's descendants, then SIGKILL those still alive after ``wait_s``
    (env workers ignore SIGTERM on purpose): the last act before an exit that skips ``close``."""
    pids = descendants(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # it ended already
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while sig == signal.SIGTERM and time.monotonic() < deadline:
            if not any(Path(f"/proc/{pid}").exists() for pid in pids):
                return
            time.sleep(0.05)
