"""Final-answer grading: lm-eval's Minerva math utilities, sympy, and math-verify.

``grade(response, reference, timeout)`` extracts the response's final answer (the last
``\\boxed{}``/``\\fbox{}``, else "The final answer is X", else, when allowed, the last bare
number), normalises both sides with lm-eval's ``normalize_final_answer`` plus a few rules the
Minerva one lacks (``\\dfrac``, percent, unit words, thin-space thousands), and compares:

1. fast paths: equal normalised strings, or equal exact rationals (so "007" is 7, "0.5" is
   "\\frac{1}{2}", "1,000" is 1000) -- no sympy, microseconds;
2. otherwise lm-eval's ``is_equiv`` (sympy ``parse_latex`` and ``simplify``), and math-verify as
   a second opinion when lm-eval's parser cannot read a side.

What is bounded, and how (:mod:`entrogym.envs.answers` has the details):

- in this process: extraction, linear in the response's last ``MAX_RESPONSE_CHARS``
  characters; normalisation and the fast paths only for answers of at most
  ``NORMALIZE_IN_PROCESS_CHARS`` characters (lm-eval's normaliser is quadratic at worst);
- in a worker process, killed when the call runs past ``timeout``: the sympy stage, and the
  normalisation and fast paths of longer answers (sympy can spend hours on ``9^{9^{9^{9}}}``,
  and ``signal.alarm`` only works in a main thread);
- not counted in ``timeout``: starting a worker when none is idle (its imports, about 1-2 s,
  at most ``STARTUP_TIMEOUT_S``); ``warm_up`` starts them ahead of time, ``prestart`` in the
  background.

Safe from any thread or process. Nothing raises on a response: an unreadable one is simply not
correct, and a timeout is reported in the result.
"""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass

from entrogym.envs.answers import (
    MAX_ANSWER_CHARS,
    MAX_RESPONSE_CHARS,
    NORMALIZE_IN_PROCESS_CHARS,
    as_number,
    extract_answer,
    fast_verdict,
    normalize_answer,
)
from entrogym.envs.grader_pool import STARTUP_TIMEOUT_S, Pool

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_RESPONSE_CHARS",
    "STARTUP_TIMEOUT_S",
    "GradeResult",
    "as_number",
    "extract_answer",
    "normalize_answer",
    "grade",
    "is_correct",
    "stats",
    "warm_up",
    "prestart",
    "shutdown",
]


@dataclass(frozen=True)
class GradeResult:
    """``correct``; the answer found in the response (None if none); whether the worker stage
    ran out of time; and which stage decided (``exact``, ``numeric``, ``sympy``,
    ``math-verify``, ``no-answer``, ``too-long``, ``timeout``, ``invalid-input``, ``error``)."""

    correct: bool
    extracted: str | None
    timed_out: bool = False
    method: str = ""


# ----- counters ------------------------------------------------------------------------------

_stats_lock = threading.Lock()
_stats: dict[str, int] = {"calls": 0, "worker_calls": 0, "timeouts": 0, "errors": 0}


def _count(key: str) -> None:
    with _stats_lock:
        _stats[key] += 1


def stats() -> dict[str, int]:
    """Counts since start in this process: calls, worker_calls (the worker stage), timeouts,
    errors."""
    with _stats_lock:
        return dict(_stats)


# ----- the public API ------------------------------------------------------------------------


def grade(
    response: str, reference: str, timeout: float = 5.0, *, allow_bare_number: bool = False
) -> GradeResult:
    """Grade ``response`` against ``reference``; never raises on their content.

    ``timeout`` (seconds, > 0) bounds the worker stage (sympy, and the normalisation of answers
    longer than ``NORMALIZE_IN_PROCESS_CHARS``); a worker that overruns it is killed and the
    result is ``GradeResult(False, ..., timed_out=True, method="timeout")``. What runs before it,
    in this process, is linear in the response (see :mod:`entrogym.envs.answers`).
    """
    if not isinstance(timeout, int | float) or not timeout > 0 or timeout == float("inf"):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    _count("calls")
    if not isinstance(response, str) or not isinstance(reference, str):
        return GradeResult(False, None, method="invalid-input")
    extracted: str | None = None
    try:
        extracted = extract_answer(
            response[-MAX_RESPONSE_CHARS:], allow_bare_number=allow_bare_number
        )
        if extracted is None:
            return GradeResult(False, None, method="no-answer")
        if len(extracted) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
            return GradeResult(False, extracted[:MAX_ANSWER_CHARS], method="too-long")
        payload = {"answer": extracted, "reference": reference, "normalized": False}
        if max(len(extracted), len(reference)) <= NORMALIZE_IN_PROCESS_CHARS:
            answer, ref = normalize_answer(extracted), normalize_answer(reference)
            if not answer:
                return GradeResult(False, extracted, method="no-answer")
            fast = fast_verdict(answer, ref)
            if fast is not None:
                return GradeResult(fast[0], extracted, method=fast[1])
            payload = {"answer": answer, "reference": ref, "normalized": True}
        _count("worker_calls")
        out = _pool().call(payload, float(timeout))
        if out is None:
            _count("timeouts")
            return GradeResult(False, extracted, timed_out=True, method="timeout")
        return GradeResult(bool(out["correct"]), extracted, method=str(out["method"]))
    except Exception as e:  # noqa: BLE001 - grading must never take the caller down
        _count("errors")
        return GradeResult(False, extracted, method=f"error: {type(e).__name__}: {e}"[:200])


def is_correct(
    response: str, reference: str, timeout: float = 5.0, *, allow_bare_number: bool = False
) -> bool:
    """``grade(...).correct``."""
    return grade(response, reference, timeout, allow_bare_number=allow_bare_number).correct


_POOL = Pool()


def _pool() -> Pool:
    return _POOL


def warm_up(workers: int = 1) -> None:
    """Start up to ``workers`` idle grading workers now, so the first sympy call is fast."""
    _POOL.warm(workers)


def prestart() -> None:
    """Start a grading worker in the background unless one is idle or starting; returns at
    once. Envs that grade call it when an episode starts, so the worker's start-up (sympy's
    imports, 1-2 s) overlaps the generation of the answer instead of delaying the first
    answer that needs sympy. In an env worker process that first answer may come at any
    iteration, each worker having its own grading worker."""
    _POOL.prestart()


def shutdown() -> None:
    """Stop the idle workers (also done at interpreter exit)."""
    _POOL.shutdown()


atexit.register(shutdown)


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork time would stay held forever in the child.
    global _stats_lock
    _stats_lock = threading.Lock()
    _POOL.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
