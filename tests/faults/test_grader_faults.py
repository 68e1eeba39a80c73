"""Hostile responses cannot hold the grader past its timeout (issue: reliability, finding 3).

The cases the issue measured (lm-eval's quadratic "Final Answer" regex: 15 s at ``timeout=5``;
a 10 MB response still running after 9 minutes; a 10 MB unclosed ``\\boxed{``: 7 s in-process)
and other 10 MB strings aimed at each in-process step: every ``grade`` call returns within
``timeout + 1`` seconds. Workers are started first: their start-up is documented as outside
``timeout``.
"""

from __future__ import annotations

import time

import pytest

from entrogym.envs import grading
from entrogym.envs.grading import grade

MB = 10_000_000
TIMEOUT = 5.0

HOSTILE = {
    "minerva-phrase-x8000": "Final Answer: The final answer is x" * 8000,
    "minerva-phrase-10MB": "Final Answer: The final answer is x" * (MB // 35),
    "minerva-phrase-lines-10MB": "Final Answer: The final answer is x\n" * (MB // 36),
    "unclosed-box-10MB": "\\boxed{" + "x" * MB,
    "unclosed-box-in-tail-1MB": "\\boxed{" + "{" * (grading.MAX_RESPONSE_CHARS - 8),
    "unclosed-box-at-end-10MB": "x" * MB + "\\boxed{" + "{" * 100_000,
    "boxes-10MB": "\\boxed{" * (MB // 7),
    "final-answer-is-10MB": "The final answer is " * (MB // 20),
    "final-answer-lines-10MB": "final answer:\n" * (MB // 14),
    "final-answer-whitespace-10MB": "final answer" + " " * MB,
    "numbers-10MB": "1 " * (MB // 2),
    "number-with-commas-10MB": "1," * (MB // 2),
    "dollars-10MB": "$" * MB,
    "long-answer-in-box": "\\boxed{" + "\\text{" * 500 + "}" * 501,  # normalised in the worker
}


@pytest.fixture(scope="module", autouse=True)
def warm_workers():
    grading.warm_up(2)


@pytest.mark.parametrize("bare", [False, True], ids=["boxed-only", "bare-number"])
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_response_returns_within_timeout(name: str, bare: bool) -> None:
    response = HOSTILE[name]
    start = time.monotonic()
    result = grade(response, "5", timeout=TIMEOUT, allow_bare_number=bare)
    elapsed = time.monotonic() - start
    print(f"{name} bare={bare}: {elapsed:.3f} s ({result.method})")
    assert elapsed <= TIMEOUT + 1.0, f"{name}: {elapsed:.1f} s"
    assert not result.correct


def test_long_answer_is_normalised_in_the_worker() -> None:
    """An answer too long to normalise in-process still grades, inside the worker's limit."""
    digits = "12" * 400  # 800 characters: past NORMALIZE_IN_PROCESS_CHARS
    assert len(digits) > grading.NORMALIZE_IN_PROCESS_CHARS
    before = grading.stats()["worker_calls"]
    result = grade(f"so \\boxed{{{digits}}}", digits, timeout=TIMEOUT)
    assert result.correct and result.method == "exact"
    assert grading.stats()["worker_calls"] == before + 1
    assert not grade(f"\\boxed{{{digits}}}", digits + "3", timeout=TIMEOUT).correct
