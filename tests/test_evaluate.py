"""``entrogym eval`` end to end with tiny-random-llama on the hf engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from entrogym.commands.eval import cli
from entrogym.train.evaluation import mean_pass_at_k, pass_at_k

TINY = ["--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32"]


def test_eval_arithmetic_writes_pass_at_k(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["--env", "entrogym/Arithmetic-v0", *TINY, "--max-tasks", "3", "--samples", "2"]
    assert cli([*argv, "--max-response-tokens", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "pass@1=" in printed and "pass@2=" in printed
    report = json.loads((out / "eval.json").read_text())
    assert not list(out.glob(".eval.json.*"))  # the temp file was renamed, not left behind
    summary, per_task = report["summary"], report["per_task"]
    assert summary["tasks"] == 3 and summary["samples"] == 2 and summary["episodes"] == 6
    assert [t["samples"] for t in per_task] == [2, 2, 2]
    assert len({t["task_id"] for t in per_task}) == 3
    for t in per_task:
        assert 0 <= t["correct"] <= 2 and len(t["rewards"]) == 2
    assert summary["pass@1"] == pytest.approx(sum(t["correct"] / 2 for t in per_task) / 3)
    assert summary["pass@2"] == pytest.approx(
        sum(pass_at_k(2, t["correct"], 2) for t in per_task) / 3
    )
    assert summary["pass@2"] >= summary["pass@1"]


def _fixture_root() -> Path:
    from entrogym.envs.appworld.fixture import cached_fixture
    from entrogym.envs.appworld.runtime import appworld_python

    try:
        appworld_python()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc} (`make appworld-setup` creates it; AppWorld tests do not skip)")
    return cached_fixture()


def test_eval_appworld_fixture_tgc_sgc_and_appworld_report(tmp_path: Path, capsys) -> None:
    root = _fixture_root()
    outputs = root / "experiments" / "outputs"
    out = tmp_path / "aw"
    argv = ["--env", "entrogym/AppWorld-v0", "--split", "test_normal", *TINY]
    argv += ["--appworld-root", str(root), "--max-tasks", "2", "--max-turns", "2"]
    assert cli([*argv, "--max-response-tokens", "8", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "TGC=" in printed and "SGC=" in printed
    report = json.loads((out / "eval.json").read_text())
    summary, per_task = report["summary"], report["per_task"]
    try:
        expected = (root / "data" / "datasets" / "test_normal.txt").read_text().split()[:2]
        assert [t["task_id"] for t in per_task] == expected
        assert summary["tgc"] == 0.0 and summary["sgc"] == 0.0  # a random model completes nothing
        assert summary["not_evaluated"] == 0  # both episodes ended at the env's turn limit
        for t in per_task:
            # the world was evaluated by AppWorld's unit tests, none of which all passed
            assert t["num_tests"][0] >= 1 and t["passes"][0] < t["num_tests"][0]
            assert t["scenario_id"] == t["task_id"].split("_")[0]
        # AppWorld's own evaluator scored the two tasks' kept outputs (a partial split)
        aw = summary["appworld_report"]
        assert aw["ok"] and aw["tasks"] == 2 and aw["missing_outputs"] == [], aw
        assert aw["aggregate"]["task_goal_completion"] == 0.0
        assert aw["report_path"].endswith("evaluations/test_normal-first2.json")
        assert "AppWorld report: TGC=0.0% SGC=0.0% over 2 tasks" in printed
    finally:
        shutil.rmtree(outputs / summary["experiment_name"], ignore_errors=True)


def test_eval_appworld_report_skipped_for_several_samples(capsys) -> None:
    from entrogym.commands.eval import EvalConfig, build_parser, prepare
    from entrogym.commands.eval_appworld import report_line
    from entrogym.commands.options import parse_options

    def parse(argv: list[str]) -> EvalConfig:
        return parse_options(build_parser(), argv, EvalConfig)

    root = _fixture_root()
    argv = ["--env", "entrogym/AppWorld-v0", *TINY, "--appworld-root", str(root)]
    prepared = prepare(parse([*argv, "--samples", "2"]))
    # the two samples of a task would overwrite each other's outputs: nothing is kept
    assert prepared["experiment"] is None and "experiment_name" not in prepared["env_kwargs"]
    line = report_line({"ok": None, "skipped": prepared["report_skipped"]})
    assert line.startswith("AppWorld report skipped: --samples 2") and "\n" not in line
    prepared = prepare(parse(argv))
    assert prepared["experiment"].startswith("entrogym-eval-")
    assert prepared["report_name"] == "test_normal" and prepared["report_skipped"] is None


def test_eval_unknown_env_exits_2(capsys) -> None:
    assert cli(["--env", "entrogym/NoSuchEnv-v0", *TINY]) == 2
    err = capsys.readouterr().err
    assert "entrogym/NoSuchEnv-v0" in err and "entrogym/Arithmetic-v0" in err


def test_eval_bad_option_exits_2(capsys) -> None:
    assert cli(["--env", "entrogym/Arithmetic-v0", *TINY, "--samples", "0"]) == 2
    assert "--samples" in capsys.readouterr().err


def test_pass_at_k_unbiased_estimator() -> None:
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 3, 2) == 1.0  # C(1, 2) = 0: any 2 of 4 include a correct one
    assert mean_pass_at_k({"x": [True, False], "y": [False, False]}, 2) == pytest.approx(0.5)
    # an early-stopped task with one sample counts at k = 1
    assert mean_pass_at_k({"x": [True], "y": [False, True, False]}, 2) == pytest.approx(
        (1 + (1 - 1 / 3)) / 2
    )
    with pytest.raises(ValueError, match="k"):
        pass_at_k(2, 1, 3)
