"""``entrogym eval`` end to end with tiny-random-llama on the hf engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from entrogym.commands.eval import cli
from entrogym.envs.arithmetic import ArithmeticEnv
from entrogym.train.evaluation.evaluate import mean_pass_at_k, pass_at_k

TINY = ["--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32"]


def test_eval_arithmetic_writes_pass_at_k(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["--env", "entrogym/Arithmetic-v0", *TINY, "--max-tasks", "3", "--samples", "4"]
    assert cli([*argv, "--pass-at", "2", "--max-response-tokens", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert " pass@1=" in printed and " @2=" in printed and " @4=" in printed
    assert "distinct_correct=" in printed
    report = json.loads((out / "eval.json").read_text())
    assert not list(out.glob(".eval.json.*"))  # the temp file was renamed, not left behind
    summary, per_task = report["summary"], report["per_task"]
    assert summary["tasks"] == 3 and summary["samples"] == 4 and summary["episodes"] == 12
    assert [t["samples"] for t in per_task] == [4, 4, 4]
    assert len({t["task_id"] for t in per_task}) == 3
    for t in per_task:
        assert 0 <= t["correct"] <= 4 and len(t["rewards"]) == 4
        assert min(t["correct"], 1) <= t["distinct_correct"] <= t["correct"]
    assert sorted(k for k in summary if k.startswith("pass@")) == ["pass@1", "pass@2", "pass@4"]
    for k in (1, 2, 4):
        want = sum(pass_at_k(4, t["correct"], k) for t in per_task) / 3
        assert summary[f"pass@{k}"] == pytest.approx(want)
    assert summary["pass@1"] == pytest.approx(sum(t["correct"] / 4 for t in per_task) / 3)
    assert summary["pass@1"] <= summary["pass@2"] <= summary["pass@4"]
    assert summary["distinct_correct_mean"] == pytest.approx(
        sum(t["distinct_correct"] for t in per_task) / 3
    )


class HookedArithmetic(ArithmeticEnv):
    """Arithmetic with every optional evaluation hook: the command must use them for any env,
    not only AppWorld (gym.make wraps it, so they are reached through get_wrapper_attr)."""

    on_turn_budget = "step"

    def __init__(self, tag: str = "plain", **kwargs) -> None:
        super().__init__(**kwargs)
        self.tag = tag

    def evaluation_env_kwargs(self, samples: int) -> dict:
        return {"tag": f"eval-{samples}", "num_test": 5}

    def evaluation_task_fields(self, task_id: str, episodes: list) -> dict:
        return {"tag": self.tag, "rewards_seen": [e.reward for e in episodes]}

    def evaluation_report(self, results: dict, out_dir, *, report_name: str, scale: float = 1):
        return {"scaled": scale * results["summary"]["pass@1"], "report_name": report_name,
                "out_dir": str(out_dir), "tasks_seen": results["tasks"],
                "summary_text": "HOOKED", "report_lines": ["hook line"]}  # fmt: skip


def test_eval_uses_any_envs_hooks(tmp_path: Path, capsys) -> None:
    import gymnasium as gym

    env_id = "evaluatetest/HookedArithmetic-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=HookedArithmetic)
    out = tmp_path / "hooked"
    argv = ["--env", env_id, *TINY, "--samples", "2", "--max-response-tokens", "4"]
    argv += ["--report-options", '{"scale": 2}', "--out", str(out)]
    assert cli(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].endswith(")") and " HOOKED (" in printed[0] and printed[1] == "hook line"
    report = json.loads((out / "eval.json").read_text())
    summary, per_task = report["summary"], report["per_task"]
    assert summary["tasks"] == 5  # num_test=5 came from evaluation_env_kwargs
    assert summary["scaled"] == pytest.approx(2 * summary["pass@1"])  # --report-options
    assert summary["report_name"] == "test" and summary["out_dir"] == str(out)
    assert summary["tasks_seen"] == [t["task_id"] for t in per_task]
    assert not {"summary_text", "report_lines"} & set(summary)
    for t in per_task:
        assert t["tag"] == "eval-2" and t["rewards_seen"] == t["rewards"]
        assert t["truncated_by"] == [None, None] and t["num_turns"] == [1, 1]
    assert report["options"]["on_turn_budget"] is None  # the env's "step" applied, unasked


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
    assert "TGC=0.0% SGC=0.0% (" in printed  # the env's summary_text, inside the summary line
    report = json.loads((out / "eval.json").read_text())
    summary, per_task = report["summary"], report["per_task"]
    try:
        expected = (root / "data" / "datasets" / "test_normal.txt").read_text().split()[:2]
        assert [t["task_id"] for t in per_task] == expected
        assert summary["split"] == "test_normal" and summary["accuracy"] == summary["pass@1"]
        assert summary["tgc"] == 0.0 and summary["sgc"] == 0.0  # a random model completes nothing
        assert summary["not_evaluated"] == 0  # both episodes ended at the env's turn limit
        assert not {"summary_text", "report_lines"} & set(summary)  # printed, not stored
        for t in per_task:
            # the world was evaluated by AppWorld's unit tests, none of which all passed
            assert t["num_tests"][0] >= 1 and t["passes"][0] < t["num_tests"][0]
            assert t["fails"][0] == t["num_tests"][0] - t["passes"][0]
            assert t["scenario_id"] == t["task_id"].split("_")[0]
            assert t["num_turns"] == [2] and t["truncated_by"] == ["env"]  # --max-turns 2
        # AppWorld's own evaluator scored the two tasks' kept outputs (a partial split)
        aw = summary["appworld_report"]
        assert aw["ok"] and aw["tasks"] == 2 and aw["missing_outputs"] == [], aw
        assert aw["aggregate"]["task_goal_completion"] == 0.0
        assert aw["report_path"].endswith("evaluations/test_normal-first2.json")
        assert "AppWorld report: TGC=0.0% SGC=0.0% over 2 tasks" in printed
        assert (out / "appworld-report.json").is_file()  # the hook's copy in --out
    finally:
        shutil.rmtree(outputs / summary["experiment_name"], ignore_errors=True)


def _prepare(argv: list[str]):
    from entrogym.commands.eval import EvalConfig, build_parser, prepare
    from entrogym.commands.options import parse_options

    return prepare(parse_options(build_parser(), [*argv, *TINY], EvalConfig))


def test_eval_takes_appworlds_rules_from_its_hooks() -> None:
    root = _fixture_root()
    argv = ["--env", "entrogym/AppWorld-v0", "--appworld-root", str(root)]
    prepared = _prepare(argv)
    assert prepared.split == "test_normal" and prepared.report_name == "test_normal"
    assert prepared.on_turn_budget == "step"  # the env's declared rule
    kwargs = prepared.env_kwargs
    assert kwargs["reward"] == "binary" and kwargs["max_turns"] == 50
    assert kwargs["appworld_root"] == str(root)  # the shortcut became an env keyword
    assert kwargs["experiment_name"].startswith("entrogym-eval-")  # outputs kept for the report
    # the two samples of a task would overwrite each other's outputs: nothing is kept
    assert "experiment_name" not in _prepare([*argv, "--samples", "2"]).env_kwargs
    # the user's options win over the env's evaluation defaults
    mine = _prepare([*argv, "--max-turns", "3", "--on-turn-budget", "truncate", "--max-tasks", "2"])
    assert mine.env_kwargs["max_turns"] == 3 and mine.on_turn_budget == "truncate"
    assert mine.report_name == "test_normal-first2"
    arith = _prepare(["--env", "entrogym/Arithmetic-v0"])
    assert arith.on_turn_budget == "truncate" and arith.hooks == frozenset()
    assert arith.env_kwargs == {}
    # a single-turn env takes no max_turns keyword: --max-turns only caps the agent's turns
    assert _prepare(["--env", "entrogym/Arithmetic-v0", "--max-turns", "3"]).env_kwargs == {}


def test_eval_env_keyword_shortcuts_bad_input_exits_2(capsys) -> None:
    argv = ["--env", "entrogym/Arithmetic-v0", *TINY]
    assert cli([*argv, "--max-turns", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_turns (--max-turns) must be >= 1" in err
    assert cli([*argv, "--report-options", '{"x": 1}']) == 2
    assert "no evaluation_report hook" in capsys.readouterr().err
    assert cli([*argv, "--split", "test", "--env-kwargs", '{"split": "train"}']) == 2
    assert "given twice" in capsys.readouterr().err


def test_eval_unknown_env_exits_2(capsys) -> None:
    assert cli(["--env", "entrogym/NoSuchEnv-v0", *TINY]) == 2
    err = capsys.readouterr().err
    assert "entrogym/NoSuchEnv-v0" in err and "entrogym/Arithmetic-v0" in err


def test_eval_bad_option_exits_2(capsys) -> None:
    assert cli(["--env", "entrogym/Arithmetic-v0", *TINY, "--samples", "0"]) == 2
    assert "--samples" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["5", "0"])
def test_eval_pass_at_outside_the_samples_exits_2_before_anything_loads(
    bad: str, capsys, monkeypatch
) -> None:
    import entrogym.agents.engines as engines
    import entrogym.commands.eval as eval_command

    def never(*args, **kwargs):
        raise AssertionError("the k must be refused before the env or a model is loaded")

    monkeypatch.setattr(eval_command, "prepare", never)
    monkeypatch.setattr(engines, "make_engine", never)
    argv = ["--env", "entrogym/Arithmetic-v0", *TINY, "--samples", "4", "--pass-at", "2", bad]
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--pass-at" in err and f"got k={bad}" in err, err


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
