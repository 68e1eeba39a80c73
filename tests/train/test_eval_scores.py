"""pass@k at the reported ks and the distinct correct answers, against hand computations."""

from __future__ import annotations

import pytest

from entrogym.agents.episode import Episode
from entrogym.train.evaluation.evaluate import EvalPlan, _scores, _task_rows
from entrogym.train.evaluation.scores import distinct_correct, final_answer, pass_at_ks


def test_the_reported_ks() -> None:
    assert pass_at_ks(1) == [1]
    assert pass_at_ks(2) == [1, 2]
    assert pass_at_ks(4) == [1, 4]
    assert pass_at_ks(20) == [1, 4, 16, 20]
    assert pass_at_ks(64) == [1, 4, 16, 64]
    assert pass_at_ks(100) == [1, 4, 16, 64, 100]
    assert pass_at_ks(8, [3, 2, 4]) == [1, 2, 3, 4, 8]
    for bad in (9, 0, -1):
        with pytest.raises(ValueError, match=rf"1 <= k <= the samples per task \(8\), got k={bad}"):
            pass_at_ks(8, [2, bad])


def test_final_answer_is_the_envs_extracted_answer_else_the_last_action() -> None:
    assert final_answer({"extracted_answer": " 1/2 ", "actions": ["x"]}) == "1/2"
    assert final_answer({"extracted_answer": None, "actions": ["a", "  the   end\n"]}) == "the end"
    assert final_answer({"actions": ["only"]}) == "only"
    assert final_answer({}) == ""
    assert distinct_correct(["7", "7", "0.5", "1/2"]) == 3
    assert distinct_correct([]) == 0


def _episode(task: str, success: bool, answer: str | None = None, **info) -> Episode:
    if answer is not None:
        info["extracted_answer"] = answer
    return Episode(task, 0, [], [], [], float(success), {"success": success, **info})


def _episodes() -> list[Episode]:
    """Task a: 8 samples, 2 correct with two spellings of one value. Task b: 8 wrong. Task c:
    8 samples, one an env error, 3 of the other 7 correct with one answer (one given as the
    last action, spaced differently)."""
    a = [_episode("a", True, "1/2"), _episode("a", True, "0.5")]
    a += [_episode("a", False, "3") for _ in range(6)]
    b = [_episode("b", False, "9") for _ in range(8)]
    c = [_episode("c", True, "7"), _episode("c", True, "7")]
    c += [_episode("c", True, actions=["think", "  7 "])]
    c += [_episode("c", False, "1") for _ in range(4)]
    c += [Episode("c", 0, [], [], [], 0.0, {"success": False}, error="env 'x', task 'c': boom")]
    return a + b + c


def test_scores_at_every_k_against_a_hand_computation() -> None:
    plan = EvalPlan("e", "test", ["a", "b", "c"], 3, {}, "truncate", frozenset())
    summary = _scores(plan, _episodes(), samples=8, pass_at=[2])
    assert sorted(k for k in summary if k.startswith("pass@")) == [
        "pass@1", "pass@2", "pass@4", "pass@8",
    ]  # fmt: skip
    # a: n=8, c=2; b: n=8, c=0; c: n=7 (the env error left out), c=3
    assert summary["pass@1"] == pytest.approx((2 / 8 + 0 + 3 / 7) / 3)
    assert summary["pass@2"] == pytest.approx(((1 - 15 / 28) + 0 + (1 - 6 / 21)) / 3)
    assert summary["pass@4"] == pytest.approx(((1 - 15 / 70) + 0 + (1 - 1 / 35)) / 3)
    assert summary["pass@8"] == pytest.approx((1 + 0 + 1) / 3)  # c: k = its 7 samples
    assert summary["accuracy"] == summary["pass@1"]
    assert summary["distinct_correct_mean"] == pytest.approx((2 + 0 + 1) / 3)
    assert summary["tasks_scored"] == 3 and summary["env_errors"] == 1
    rows = {r["task_id"]: r for r in _task_rows(plan, _episodes())}
    assert [rows[t]["correct"] for t in "abc"] == [2, 0, 3]
    assert [rows[t]["distinct_correct"] for t in "abc"] == [2, 0, 1]


def test_scores_when_no_episode_ran() -> None:
    plan = EvalPlan("e", "test", ["a"], 1, {}, "truncate", frozenset())
    broken = [Episode("a", 0, [], [], [], 0.0, {}, error="boom") for _ in range(4)]
    summary = _scores(plan, broken, samples=4)
    assert summary["pass@1"] is None and summary["pass@4"] is None
    assert summary["distinct_correct_mean"] is None and summary["tasks_scored"] == 0
