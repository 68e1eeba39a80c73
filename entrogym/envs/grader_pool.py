"""Grading worker processes: the time-bounded stage of :mod:`entrogym.envs.grading`.

A request is ``{"answer", "reference", "normalized"}``: normalised answers go straight to sympy
(:func:`equivalent`); raw ones (too long to normalise in the caller's process) are normalised
and tried on the fast paths here first (:func:`judge`), inside the caller's timeout.

Each worker is a :class:`entrogym.workers.WorkerProcess` speaking JSON; a call that runs past
its timeout kills the worker (sympy can spend hours on ``9^{9^{9^{9}}}``) and a replacement is
started in the background.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from entrogym.envs.answers import fast_verdict, normalize_answer
from entrogym.envs.minerva import minerva
from entrogym.workers import TIMED_OUT, WorkerDied, WorkerProcess, serve

STARTUP_TIMEOUT_S = 60.0  # a cold worker imports sympy, antlr and math-verify once
_MAX_IDLE = max(1, int(os.environ.get("ENTROGYM_GRADER_WORKERS", "2")))
_WORKER_MEMORY_MB = int(os.environ.get("ENTROGYM_GRADER_MAX_MEMORY_MB", "3072"))


class Worker(WorkerProcess):
    """One grading subprocess (JSON messages)."""

    def __init__(self) -> None:
        super().__init__("entrogym.envs.grader_pool:worker_main", codec="json")

    def wait_ready(self) -> None:  # type: ignore[override]
        try:
            ready = super().wait_ready(STARTUP_TIMEOUT_S, "grading worker")
        except RuntimeError:
            ready = None
        if not isinstance(ready, dict) or ready.get("ready") is not True:
            self.kill()
            raise RuntimeError(
                'the grading worker did not start; run `python -c "from entrogym.envs.grader_pool '
                'import worker_main; worker_main()"` to see its error'
            )


class Pool:
    """Idle workers, handed to one caller at a time.

    A caller finding none waits for one being started in the background (after a kill) or
    starts its own, so concurrent calls never queue behind each other's timeouts.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._idle: list[Worker] = []
        self._starting = 0  # background starts that will land in _idle
        self._waiting = 0

    def _acquire(self) -> Worker:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        with self._cond:
            while not self._idle and self._starting > self._waiting:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._waiting += 1
                try:
                    self._cond.wait(remaining)
                finally:
                    self._waiting -= 1
            if self._idle:
                return self._idle.pop()
        worker = Worker()
        worker.wait_ready()
        return worker

    def _release(self, worker: Worker) -> None:
        with self._cond:
            if len(self._idle) < _MAX_IDLE:
                self._idle.append(worker)
                self._cond.notify()
                return
        worker.kill()

    def warm(self, n: int) -> None:
        with self._cond:
            missing = max(0, min(n, _MAX_IDLE) - len(self._idle) - self._starting)
        workers = [Worker() for _ in range(missing)]
        for w in workers:
            w.wait_ready()
            self._release(w)

    def call(self, payload: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        worker = self._acquire()
        try:
            reply = worker.call(payload, timeout)
        except (OSError, WorkerDied):
            worker.kill()
            self._replace_in_background()
            raise
        if reply is TIMED_OUT:
            worker.kill()
            self._replace_in_background()
            return None
        self._release(worker)
        return reply

    def prestart(self) -> None:
        """Start a worker in the background when none is idle or starting, and return at once."""
        with self._cond:
            if self._idle or self._starting:
                return
        self._replace_in_background()

    def _replace_in_background(self) -> None:
        """Start a worker for the next call now, so it does not pay the start-up after a kill."""
        with self._cond:
            if len(self._idle) + self._starting >= _MAX_IDLE:
                return
            self._starting += 1

        def start() -> None:
            worker = None
            try:
                worker = Worker()
                worker.wait_ready()
            except (OSError, RuntimeError):
                worker = None
            if worker is not None:
                self._release(worker)
            with self._cond:
                self._starting -= 1
                self._cond.notify_all()

        threading.Thread(target=start, name="entrogym-grader-start", daemon=True).start()

    def shutdown(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()

    def forget(self) -> None:
        """In a forked child: drop the parent's workers without touching their processes."""
        for w in self._idle:
            w.close_pipes()
        self._idle = []
        self._starting = self._waiting = 0
        self._cond = threading.Condition()


def equivalent(answer: str, reference: str) -> tuple[bool, str]:
    """Worker side: lm-eval's sympy verdict, or math-verify's where lm-eval cannot parse."""
    m = minerva()
    try:
        m.parse_latex(answer)
        m.parse_latex(reference)
        readable = True
    except Exception:  # noqa: BLE001 - any parser failure means "lm-eval gives up"
        readable = False
    if readable:
        return bool(m.is_equiv(answer, reference)), "sympy"
    from math_verify import parse, verify

    gold, pred = parse(f"${reference}$"), parse(f"${answer}$")
    return bool(gold and pred and verify(gold, pred)), "math-verify"


def judge(request: dict[str, Any]) -> tuple[bool, str]:
    """Worker side: the verdict on one request (see the module docstring)."""
    answer, reference = request["answer"], request["reference"]
    if not request.get("normalized", True):
        answer, reference = normalize_answer(answer), normalize_answer(reference)
        if not answer:
            return False, "no-answer"
        fast = fast_verdict(answer, reference)
        if fast is not None:
            return fast
    return equivalent(answer, reference)


def _warm_up() -> dict[str, bool]:
    # First calls load antlr's tables and sympy's simplify machinery (about a second); pay
    # that before "ready" so it never counts against a caller's timeout.
    equivalent("\\frac{x}{2}", "0.5x")
    equivalent("(1,2]", "(1,2]")
    return {"ready": True}


def _answer(request: Any) -> dict[str, Any]:
    try:
        correct, method = judge(request)
        return {"correct": correct, "method": method}
    except BaseException as e:  # noqa: BLE001 - MemoryError, RecursionError: answer "no"
        return {"correct": False, "method": f"error: {type(e).__name__}"}


def worker_main() -> None:
    """Entry point of a grading worker process (JSON messages on stdin/stdout)."""
    serve(_answer, codec="json", memory_mb=_WORKER_MEMORY_MB, warm_up=_warm_up)
