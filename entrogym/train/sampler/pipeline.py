"""Rollouts ahead of the update, with bounded staleness (``--max-staleness K``).

The policy's weight version ``v`` is the weights after ``v`` updates (``adapters/vNNNNNN``).
Iteration ``i`` trains on the batch sampled by version

    ``sampling_version(i) = max(floor, i - K)``

where ``floor`` is the oldest version the run holds when the pipeline starts (0 for a fresh
run). With ``K = 0`` every batch is sampled by the weights it updates: the synchronous loop,
collect then update, nothing in the background. With ``K >= 1`` a rollout thread collects the
batches of iterations ``i + 1 .. i + K`` while iteration ``i`` updates; it waits for a version
before sampling with it, so no batch is more than ``K`` versions old, and at most ``K`` batches
wait in memory.

The version of each batch is fixed by its iteration, not by how fast either side runs: a run
samples the same episodes however the machine's load shifts, and a run resumed from a checkpoint
(which keeps the ``K`` versions before its own) collects again exactly the batches it had not
trained on when it stopped: none is lost, none is trained twice.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
# How long closing waits for the rollout thread; it stops at its next generation step when its
# ``collect`` checks :attr:`RolloutPipeline.stopping` (the trainer's does).
JOIN_TIMEOUT_S = 60.0


def sampling_version(iteration: int, max_staleness: int, floor: int = 0) -> int:
    """The weight version that samples ``iteration``'s batch (module docstring)."""
    return max(floor, iteration - max_staleness)


class RolloutPipeline(Generic[T]):
    """``collect(iteration, version)`` for iterations ``start .. stop - 1``, in order.

    ``get(i)`` returns iteration ``i``'s result (collected in the background when
    ``max_staleness >= 1``, right now when it is 0), ``published(v)`` says that version ``v``
    exists. An exception raised by ``collect`` is raised again by the ``get`` of its iteration.
    ``before_batch`` runs in the rollout thread before each batch (its share of the cores).
    Use as a context manager: leaving it stops the rollout thread and waits for it
    (:meth:`close`).
    """

    def __init__(
        self,
        collect: Callable[[int, int], T],
        *,
        max_staleness: int,
        start: int,
        stop: int,
        floor: int = 0,
        before_batch: Callable[[], Any] | None = None,
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.collect, self.max_staleness = collect, max_staleness
        self.start, self.stop, self.floor = start, stop, floor
        self.before_batch = before_batch
        self.wait_s = 0.0  # seconds ``get`` waited for the rollout thread, last call
        self._published = start  # the weights the run starts from exist
        self._ready: deque[tuple[int, T | None, BaseException | None]] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._collecting = False
        self._thread: threading.Thread | None = None

    def version_of(self, iteration: int) -> int:
        return sampling_version(iteration, self.max_staleness, self.floor)

    def __enter__(self) -> RolloutPipeline[T]:
        if self.max_staleness > 0 and self.start < self.stop:
            self._thread = threading.Thread(target=self._run, name="rollouts", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def collecting(self) -> bool:
        """Whether the rollout thread is collecting a batch now (not waiting for a version,
        nor finished)."""
        return self._collecting

    @property
    def stopping(self) -> bool:
        """Whether the pipeline was closed: a collection in progress should be abandoned."""
        return self._stopping

    def close(self) -> None:
        """Stop the rollout thread: it is told to (:attr:`stopping`) and waited for, at most
        ``JOIN_TIMEOUT_S``. A daemon thread still inside a C++ call (a torch op) when the
        interpreter exits aborts the process (SIGABRT, "terminate called without an active
        exception"), so the thread must end before the run does."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)

    def published(self, version: int) -> None:
        """Version ``version`` of the weights exists (its adapter is written)."""
        with self._cond:
            self._published = max(self._published, version)
            self._cond.notify_all()

    def get(self, iteration: int) -> T:
        """Iteration ``iteration``'s batch; ``wait_s`` says how long the caller waited."""
        if self._thread is None:
            t0 = time.perf_counter()
            result = self.collect(iteration, self.version_of(iteration))
            self.wait_s = time.perf_counter() - t0
            return result
        t0 = time.perf_counter()
        with self._cond:
            while not self._ready:
                self._cond.wait()
            done, result, error = self._ready.popleft()
        self.wait_s = time.perf_counter() - t0
        if done != iteration:  # the loop and the pipeline disagree: a bug, never data
            raise RuntimeError(f"rollout pipeline returned iteration {done} for {iteration}")
        if error is not None:
            raise error
        return result  # type: ignore[return-value]

    def _run(self) -> None:
        for iteration in range(self.start, self.stop):
            version = self.version_of(iteration)
            with self._cond:
                while self._published < version and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
            self._collecting = True
            if self.before_batch is not None:  # e.g. this thread's share of the cores
                self.before_batch()
            try:
                item = (iteration, self.collect(iteration, version), None)
            except BaseException as exc:  # noqa: BLE001  (handed to the training loop)
                item = (iteration, None, exc)
            finally:
                self._collecting = False
            with self._cond:
                self._ready.append(item)
                self._cond.notify_all()
            if item[2] is not None:
                return
