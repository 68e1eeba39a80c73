"""The answer grader: a hand-written truth table, hostile inputs, threads and processes."""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest

from entrogym.envs import grading
from entrogym.envs.grading import GradeResult, grade, is_correct

# (response, reference, expected) -- written by hand, each checked against the rules of
# entrogym.envs.grading's docstring.
TRUTH_TABLE: list[tuple[str, str, bool]] = [
    # the last box wins
    (r"so the answer is \boxed{7}.", "7", True),
    (r"\boxed{5} ... no wait, \boxed{7}", "7", True),
    (r"\boxed{7} ... no wait, \boxed{5}", "7", False),
    (r"\fbox{12}", "12", True),
    (r"\boxed{3} but finally \fbox{4}", "4", True),
    (r"\fbox{4} but finally \boxed{3}", "4", False),
    (r"$\boxed{204}$", "204", True),
    (r"\boxed{\{1,2\}}", r"\{1,2\}", True),
    (r"\boxed {42}", "42", True),
    (r"\boxed 42$ is it", "42", True),
    # "The final answer is X" without a box
    ("The final answer is 42.", "42", True),
    ("Final Answer: The final answer is $24$. I hope it is correct.", "24", True),
    ("the final answer is: 17", "17", True),
    ("Final answer: 9", "9", True),
    ("The final answer is 41.", "42", False),
    (r"The final answer is $\frac{3}{4}$.", r"\frac{3}{4}", True),
    # fractions, \dfrac, decimals
    (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}", True),
    (r"\boxed{\tfrac{1}{2}}", "0.5", True),
    (r"\boxed{0.5}", r"\frac12", True),
    (r"\boxed{1/2}", r"\frac{1}{2}", True),
    (r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", True),
    (r"\boxed{-\frac{2}{3}}", r"-\frac{2}{3}", True),
    (r"\boxed{\frac{2}{3}}", r"-\frac{2}{3}", False),
    (r"\boxed{0.333}", r"\frac{1}{3}", False),
    (r"\boxed{7.0}", "7", True),
    (r"\boxed{7.00}", "7", True),
    (r"\boxed{7.5}", "7", False),
    (r"\boxed{.5}", "0.5", True),
    # percent and units stripped
    (r"\boxed{50\%}", "50", True),
    (r"\boxed{50%}", "50", True),
    (r"\boxed{12 \text{ apples}}", "12", True),
    (r"\boxed{30^\circ}", "30", True),
    (r"\boxed{15 \text{ cm}}", "15", True),
    (r"\boxed{\$25}", "25", True),
    (r"\boxed{5 \text{ inches}}", "6", False),
    (r"\boxed{90 degrees}", "90", True),
    # leading zeros, thousands separators, negative numbers
    (r"\boxed{007}", "7", True),
    (r"\boxed{070}", "70", True),
    (r"\boxed{070}", "7", False),
    (r"\boxed{1,000}", "1000", True),
    (r"\boxed{1{,}000}", "1000", True),
    (r"\boxed{1\,000}", "1000", True),
    (r"\boxed{12,345,678}", "12345678", True),
    (r"\boxed{-3}", "-3", True),
    (r"\boxed{−3}", "-3", True),
    (r"\boxed{3}", "-3", False),
    (r"\boxed{-0}", "0", True),
    (r"\boxed{x = 5}", "5", True),
    # plain integers against LaTeX references, and symbolic equivalence (sympy stage)
    (r"\boxed{1024}", "2^{10}", True),
    (r"\boxed{2^{10}}", "1024", True),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", True),
    (r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt{2}}{2}", True),
    (r"\boxed{\frac{\pi}{2}}", r"\pi/2", True),
    (r"\boxed{3\pi}", r"\pi", False),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", True),
    (r"\boxed{(1,2]}", "(1, 2]", True),
    (r"\boxed{(1,2)}", "(1, 2]", False),
    # where lm-eval's parser gives up (sets, intervals, tuples): math-verify decides
    (r"\boxed{(1,2]}", "(1,2.0]", True),
    (r"\boxed{\{1,2\}}", r"\{2,1\}", True),
    (r"\boxed{(0.5, 3)}", r"(\frac{1}{2}, 3)", True),
    (r"\boxed{(0.5, 4)}", r"(\frac{1}{2}, 3)", False),
    (r"\boxed{{7}}", "7", True),
    (r"\boxed{(7)}", "7", True),
    # no answer at all
    ("I am not sure.", "7", False),
    ("", "7", False),
    ("The value is 7", "7", False),
    (r"\boxed{}", "7", False),
    (r"\boxed{7", "7", False),
    ("   \n\n  ", "0", False),
]


def test_table_is_large_enough() -> None:
    assert len(TRUTH_TABLE) >= 60


@pytest.fixture(scope="module", autouse=True)
def _warm_workers() -> None:
    grading.warm_up(2)


@pytest.mark.parametrize(("response", "reference", "expected"), TRUTH_TABLE)
def test_truth_table(response: str, reference: str, expected: bool) -> None:
    start = time.monotonic()
    result = grade(response, reference, timeout=10.0)
    assert isinstance(result, GradeResult)
    assert result.correct is expected, result
    assert not result.timed_out
    assert time.monotonic() - start < 10.0 + grading.STARTUP_TIMEOUT_S
    assert is_correct(response, reference, timeout=10.0) is expected


def test_bare_number_only_when_allowed() -> None:
    assert grade("37 + 58 = 95", "95").correct is False
    result = grade("37 + 58 = 95", "95", allow_bare_number=True)
    assert result.correct and result.extracted == "95"
    assert grade("the sum is 1,234.", "1234", allow_bare_number=True).correct
    assert grade("it is -12", "-12", allow_bare_number=True).correct
    assert grade(r"maybe 5, so \boxed{6}", "6", allow_bare_number=True).extracted == "6"
    assert grade("no digits here", "3", allow_bare_number=True).method == "no-answer"


def test_math_verify_is_the_second_opinion() -> None:
    result = grade(r"\boxed{\{1,2\}}", r"\{2,1\}", timeout=10.0)
    assert result.correct and result.method == "math-verify"
    assert grade(r"\boxed{2^{10}}", "1024", timeout=10.0).method == "sympy"


def test_fast_paths_stay_in_process() -> None:
    before = grading.stats()["worker_calls"]
    for response, reference in [(r"\boxed{007}", "7"), (r"\boxed{0.5}", r"\frac{1}{2}")]:
        assert grade(response, reference).method in {"exact", "numeric"}
    assert grading.stats()["worker_calls"] == before


HOSTILE = [
    r"\boxed{9^{9^{9^{9}}}}",
    r"\boxed{" + "(" * 1000 + "x+1" + ")" * 1000 + "}",
    r"\boxed{10^{10^{10^{10}}} - 10^{10^{10^{10}}} + 1}",
    r"\boxed{" + "{" * 2000 + "1" + "}" * 2000 + "}",
    r"\boxed{" + r"\frac{1}{" * 300 + "2" + "}" * 300 + "}",
    r"\boxed{" + "9" * 5000 + "}",
    "\\boxed{" * 5000,
    "x" * 200_000 + r" \boxed{7}",
]


@pytest.mark.parametrize("response", HOSTILE, ids=[f"hostile-{i}" for i in range(len(HOSTILE))])
def test_hostile_inputs_are_bounded(response: str) -> None:
    timeout = 1.0
    start = time.monotonic()
    result = grade(response, "7", timeout=timeout)
    elapsed = time.monotonic() - start
    assert isinstance(result.correct, bool)
    # One killed worker is replaced in the background; a call may wait for that start-up.
    assert elapsed < timeout + grading.STARTUP_TIMEOUT_S
    if result.timed_out:
        assert result.method == "timeout" and not result.correct


def test_power_tower_times_out_and_is_counted() -> None:
    before = grading.stats()["timeouts"]
    start = time.monotonic()
    result = grade(r"\boxed{9^{9^{9^{9}}}}", "7", timeout=1.0)
    assert result.timed_out and not result.correct and result.method == "timeout"
    assert grading.stats()["timeouts"] == before + 1
    # the worker start-up is outside the timeout; the sympy stage itself stops at 1 s
    assert time.monotonic() - start < 1.0 + grading.STARTUP_TIMEOUT_S
    # and the grader still works afterwards
    assert grade(r"\boxed{2^{3}}", "8", timeout=10.0).correct


def test_bad_arguments() -> None:
    assert grade(None, "7") == GradeResult(False, None, method="invalid-input")  # type: ignore[arg-type]
    assert grade("7", 7).method == "invalid-input"  # type: ignore[arg-type]
    for timeout in (0, -1.0, float("inf"), float("nan"), "5"):
        with pytest.raises(ValueError, match="timeout"):
            grade(r"\boxed{7}", "7", timeout=timeout)  # type: ignore[arg-type]


def test_worker_crash_is_not_correct(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that dies mid-call yields an error result, not an exception."""

    def crash(payload: dict, timeout: float) -> None:
        raise EOFError("grading worker exited")

    monkeypatch.setattr(grading._POOL, "call", crash)
    result = grade(r"\boxed{x+1}", "x+1.5")
    assert not result.correct and result.method.startswith("error: EOFError")


SYMBOLIC = [
    (r"\boxed{2^{10}}", "1024", True),
    (r"\boxed{\sqrt{8}}", r"2\sqrt{2}", True),
    (r"\boxed{x+1}", "x+2", False),
    (r"\boxed{\frac{\pi}{4}}", r"\pi/4", True),
]


def test_thread_safety() -> None:
    jobs = SYMBOLIC * 3 + [(r, ref, e) for r, ref, e in TRUTH_TABLE[:12]]
    errors: list[BaseException] = []

    def one(job: tuple[str, str, bool]) -> bool:
        return grade(job[0], job[1], timeout=20.0).correct == job[2]

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, jobs))
    assert not errors
    assert all(results)
    # a hostile call in one thread does not hold up the others
    with ThreadPoolExecutor(max_workers=2) as pool:
        slow = pool.submit(grade, r"\boxed{9^{9^{9^{9}}}}", "7", 2.0)
        fast = pool.submit(grade, r"\boxed{007}", "7", 2.0)
        assert fast.result().correct
        assert slow.result().timed_out
    assert threading.active_count() < 20


def _grade_job(job: tuple[str, str, bool]) -> bool:
    return grade(job[0], job[1], timeout=20.0).correct == job[2]


def test_process_safety_after_fork() -> None:
    grading.warm_up(1)  # the children must not share the parent's warm workers' pipes
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
        results = list(pool.map(_grade_job, SYMBOLIC))
    assert all(results)
    assert grade(r"\boxed{2^{4}}", "16").correct  # the parent's pool is intact


def test_prestart_starts_one_worker_in_the_background() -> None:
    """prestart returns at once, starts one worker (not one per call), and the next call
    finds it idle instead of paying the start-up."""
    from entrogym.envs.grader_pool import Pool

    pool = Pool()
    try:
        start = time.monotonic()
        pool.prestart()
        pool.prestart()  # one is starting: no second one
        assert time.monotonic() - start < 0.5  # the imports run in the background
        assert pool._starting == 1 and not pool._idle
        deadline = time.monotonic() + grading.STARTUP_TIMEOUT_S
        while not pool._idle and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(pool._idle) == 1 and pool._starting == 0
        pool.prestart()  # one is idle: nothing to start
        assert pool._starting == 0
        reply = pool.call({"answer": "2^{10}", "reference": "1024", "normalized": True}, 20.0)
        assert reply is not None and reply["correct"]
    finally:
        pool.shutdown()


@pytest.mark.parametrize("env_id", ["entrogym/Arithmetic-v0", "entrogym/AIME-v0"])
def test_grading_envs_prestart_the_grader_when_an_episode_starts(
    env_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from entrogym.envs.base import make_text_env, task_ids_of

    calls: list[int] = []
    monkeypatch.setattr(grading, "prestart", lambda: calls.append(1))
    env = make_text_env(env_id)
    assert not calls  # building an env (listing tasks) starts nothing
    env.reset(options={"task_id": task_ids_of(env)[0]})
    assert calls == [1]
    env.close()
