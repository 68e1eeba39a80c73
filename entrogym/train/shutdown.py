"""Stopping a run on SIGTERM or SIGINT without losing a completed iteration.

Schedulers send SIGTERM some time before they kill a job; Ctrl-C sends SIGINT. While a run
trains, :class:`ShutdownRequest` turns either signal into a request the trainer checks at safe
points: rollouts in progress are abandoned (the weights are still those of the last completed
iteration), an update in progress is finished, and the trainer then writes a checkpoint of
the last completed iteration and raises :class:`Interrupted`. The command prints "interrupted;
resume with --resume" and exits 128 + the signal's number (143 for SIGTERM, 130 for SIGINT).

If that takes longer than the grace period (``--shutdown-grace``, default 30 s), the process
exits anyway with the same code; the checkpoints already written stay intact (they are
written atomically), so at most the iterations since the last one are redone on resume. A
second signal stops at once (Ctrl-C twice; ``multiprocessing``'s ``terminate()`` after a
Ctrl-C).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
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


class ShutdownRequest:
    """SIGTERM / SIGINT handlers for the life of a ``with`` block (in the main thread; in any
    other thread it changes nothing and never asks to stop)."""

    def __init__(self, grace_s: float, prog: str = "entrogym train") -> None:
        self.grace_s, self.prog = grace_s, prog
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._timer: threading.Timer | None = None

    def __enter__(self) -> ShutdownRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._timer is not None:
            self._timer.cancel()

    def requested(self) -> bool:
        """Whether a signal asked the run to stop."""
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # a second signal: stop now
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            print(f"{self.prog}: stopping now. interrupted; resume with --resume",
                  file=sys.stderr, flush=True)  # fmt: skip
            os._exit(128 + signum)
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
