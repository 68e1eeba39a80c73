"""Final-answer grading: lm-eval's Minerva math utilities, sympy, and math-verify.

``grade(response, reference, timeout)`` extracts the response's final answer (the last
``\\boxed{}``/``\\fbox{}``, else "The final answer is X", else, when allowed, the last bare
number), normalises both sides with lm-eval's ``normalize_final_answer`` plus a few rules the
Minerva one lacks (``\\dfrac``, percent, unit words, thin-space thousands), and compares:

1. in-process fast paths: equal normalised strings, or equal exact rationals (so "007" is 7,
   "0.5" is "\\frac{1}{2}", "1,000" is 1000) -- no sympy, microseconds;
2. otherwise, in a worker process: lm-eval's ``is_equiv`` (sympy ``parse_latex`` and
   ``simplify``), and math-verify as a second opinion when lm-eval's parser cannot read a side.

Step 2 runs in a small pool of reusable worker processes that are killed when a call runs past
``timeout`` (sympy can spend hours on ``9^{9^{9^{9}}}``, and ``signal.alarm`` only works in a
main thread), so every call is bounded and safe from any thread or process. Nothing raises on
a response: an unreadable one is simply not correct, and a timeout is reported in the result.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import re
import sys
import threading
from dataclasses import dataclass
from fractions import Fraction
from importlib import import_module
from pathlib import Path
from types import ModuleType

from entrogym.envs.grader_pool import STARTUP_TIMEOUT_S, Pool

__all__ = [
    "STARTUP_TIMEOUT_S",
    "GradeResult",
    "grade",
    "is_correct",
    "stats",
    "warm_up",
    "shutdown",
]

MAX_ANSWER_CHARS = 4096  # longer "answers" are not answers, and would cost quadratic regexes


@dataclass(frozen=True)
class GradeResult:
    """``correct``; the answer found in the response (None if none); whether the sympy stage
    ran out of time; and which stage decided (``exact``, ``numeric``, ``sympy``,
    ``math-verify``, ``no-answer``, ``timeout``, ``invalid-input``, ``error``)."""

    correct: bool
    extracted: str | None
    timed_out: bool = False
    method: str = ""


# ----- lm-eval's Minerva utilities -------------------------------------------------------------

_minerva_lock = threading.Lock()
_minerva_module: ModuleType | None = None


def minerva() -> ModuleType:
    """``lm_eval.tasks.minerva_math.utils``, loaded once.

    Importing it by name runs ``lm_eval.tasks/__init__`` (the task manager, ``datasets``,
    ``pandas``): 2 s and 200 MB per grading process. The module itself needs only sympy,
    antlr and math-verify, so it is loaded from its file unless already imported.
    """
    global _minerva_module
    with _minerva_lock:
        if _minerva_module is not None:
            return _minerva_module
        name = "lm_eval.tasks.minerva_math.utils"
        module = sys.modules.get(name)
        spec = importlib.util.find_spec("lm_eval")
        path = None
        if module is None and spec is not None and spec.submodule_search_locations:
            candidate = (
                Path(list(spec.submodule_search_locations)[0]) / "tasks/minerva_math/utils.py"
            )
            path = candidate if candidate.is_file() else None
        if module is None and path is not None:
            file_spec = importlib.util.spec_from_file_location("_entrogym_minerva_utils", path)
            assert file_spec is not None and file_spec.loader is not None
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
        if module is None:
            module = import_module(name)
        _minerva_module = module
        return module


# ----- extraction and normalisation (in-process, linear time) ---------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_FINAL_RE = re.compile(r"final answer\s*(?:is|:)[ \t:]*([^\n]*)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"[-−]?\d[\d,]*(?:\.\d+)?")
_UNIT_WORD_RE = re.compile(
    r"^([-+]?\d[\d,]*(?:\.\d+)?)\s*(?:\\(?:text|mbox|mathrm)\{[^{}]*\}|[A-Za-z]+\.?)$"
)


def _last_box(text: str) -> str | None:
    """Content of the last ``\\boxed``/``\\fbox`` (braced, or ``\\boxed 5`` up to ``$``/newline).

    lm-eval's ``last_boxed_only_string`` prefers any ``\\boxed `` over a later ``\\boxed{`` and
    any ``\\boxed`` over a later ``\\fbox``, so the last box would not always win.
    """
    matches = list(_BOX_RE.finditer(text))
    if not matches:
        return None
    i = matches[-1].end()
    if i < len(text) and text[i] == "{":
        depth = 0
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j]
        return None  # unclosed: the response was cut inside its answer
    if i < len(text) and text[i] == " ":
        rest = text[i + 1 :]
        return re.split(r"[$\n]", rest, maxsplit=1)[0].strip() or None
    return None


def _final_answer_phrase(text: str) -> str | None:
    found = minerva().get_unnormalized_answer(text)
    if found != "[invalidanswer]":
        return found or None
    matches = list(_FINAL_RE.finditer(text))
    for match in reversed(matches):
        answer = re.split(r"\.\s", match.group(1), maxsplit=1)[0].strip().rstrip(".").strip()
        if answer:
            return answer
    return None


def extract_answer(response: str, *, allow_bare_number: bool = False) -> str | None:
    """The response's final answer: last box, else "final answer is X", else (when
    ``allow_bare_number``) the last number in the text; None when there is none."""
    boxed = _last_box(response)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    phrase = _final_answer_phrase(response)
    if phrase is not None:
        return phrase
    if allow_bare_number:
        numbers = _NUMBER_RE.findall(response)
        if numbers:
            return numbers[-1].rstrip(",")
    return None


def normalize_answer(answer: str) -> str:
    """lm-eval's ``normalize_final_answer`` after rules it lacks (see the module docstring)."""
    s = answer.strip().replace("−", "-")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"(?<=\d)\\[,;!]\s*(?=\d{3})", "", s)  # 1\,000 -> 1000
    s = s.strip().rstrip(".").strip()
    unit = _UNIT_WORD_RE.match(s)
    if unit:
        s = unit.group(1)
    s = minerva().normalize_final_answer(s).strip().rstrip(".")
    # "{7}" and "((7))" are 7; "(1,2)" stays a tuple. A few layers at most: each check is linear.
    for _ in range(8):
        if not (
            len(s) >= 2
            and (
                (s[0] == "{" and s[-1] == "}" and _balanced(s[1:-1], "{}"))
                or (s[0] == "(" and s[-1] == ")" and "," not in s and _balanced(s[1:-1], "()"))
            )
        ):
            break
        s = s[1:-1]
    return s


def _balanced(s: str, pair: str) -> bool:
    depth = 0
    for ch in s:
        if ch == pair[0]:
            depth += 1
        elif ch == pair[1]:
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


_INT_RE = re.compile(r"[+-]?\d+")
_DEC_RE = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)")
_FRAC_RE = re.compile(r"([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}")
_SLASH_RE = re.compile(r"([+-]?\d+)/(\d+)")


def as_number(s: str) -> Fraction | None:
    """Exact value of a plain integer, decimal or integer fraction; None for anything else."""
    s = s.replace(" ", "")
    if not s or len(s) > 1000:
        return None
    try:
        if _INT_RE.fullmatch(s) or _DEC_RE.fullmatch(s):
            return Fraction(s)
        if m := _FRAC_RE.fullmatch(s):
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) == "-" else value
        if m := _SLASH_RE.fullmatch(s):
            return Fraction(int(m.group(1)), int(m.group(2)))
    except (ValueError, ZeroDivisionError):
        return None
    return None


# ----- counters ------------------------------------------------------------------------------

_stats_lock = threading.Lock()
_stats: dict[str, int] = {"calls": 0, "worker_calls": 0, "timeouts": 0, "errors": 0}


def _count(key: str) -> None:
    with _stats_lock:
        _stats[key] += 1


def stats() -> dict[str, int]:
    """Counts since start in this process: calls, worker_calls (sympy stage), timeouts, errors."""
    with _stats_lock:
        return dict(_stats)


# ----- the public API ------------------------------------------------------------------------


def grade(
    response: str, reference: str, timeout: float = 5.0, *, allow_bare_number: bool = False
) -> GradeResult:
    """Grade ``response`` against ``reference``; never raises on their content.

    ``timeout`` (seconds, > 0) bounds the sympy stage; a worker that overruns it is killed and
    the result is ``GradeResult(False, ..., timed_out=True, method="timeout")``.
    """
    if not isinstance(timeout, int | float) or not timeout > 0 or timeout == float("inf"):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    _count("calls")
    if not isinstance(response, str) or not isinstance(reference, str):
        return GradeResult(False, None, method="invalid-input")
    extracted: str | None = None
    try:
        extracted = extract_answer(response, allow_bare_number=allow_bare_number)
        if extracted is None:
            return GradeResult(False, None, method="no-answer")
        if len(extracted) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
            return GradeResult(False, extracted[:MAX_ANSWER_CHARS], method="too-long")
        answer, ref = normalize_answer(extracted), normalize_answer(reference)
        if not answer:
            return GradeResult(False, extracted, method="no-answer")
        if answer == ref:
            return GradeResult(True, extracted, method="exact")
        a, r = as_number(answer), as_number(ref)
        if a is not None and r is not None:
            return GradeResult(a == r, extracted, method="numeric")
        _count("worker_calls")
        out = _pool().call({"answer": answer, "reference": ref}, float(timeout))
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


def shutdown() -> None:
    """Stop the idle workers (also done at interpreter exit)."""
    _POOL.shutdown()


atexit.register(shutdown)


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork time would stay held forever in the child.
    global _minerva_lock, _stats_lock
    _minerva_lock, _stats_lock = threading.Lock(), threading.Lock()
    _POOL.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
