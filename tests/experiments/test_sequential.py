"""``entrogym sequential`` through the command a user types, on tiny-random-llama: stage 1 on A,
stage 2 on B from each stage-1 adapter, pass@k, summary.json and plots; bad input is one line,
exit 2, before any model loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from entrogym.cli import main
from entrogym.commands.demo_runs import parse_run, split_run
from entrogym.experiments.sequential import PAIRS, late_accuracy, stage_area
from entrogym.experiments.sequential_report import goals

TINY = ["--model", "tiny-random-llama", "--stage1-iterations", "2", "--stage2-iterations", "2",
        "--eval-tasks", "2", "--pass-tasks", "2", "--pass-samples", "4", "--workers", "1"]  # fmt: skip


def test_sequential_runs_both_stages_and_writes_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "seq"
    runs = ["grpo", "held=grpo --algo.lever entropy-bonus --algo.controller paper"]
    assert main(["sequential", *TINY, "--out", str(out), "--runs", *runs]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["held"] == "held"
    assert [r["label"] for r in summary["runs"]] == ["grpo", "held"]
    for run in summary["runs"]:
        one, two = run["stage1"], run["stage2"]
        assert len(one["entropy"]) == len(one["entropy_target"]) == 2
        assert set(one["pass_at_k"]) == {"1", "4", "distinct"}
        assert 0.0 <= one["pass_at_k"]["1"] <= one["pass_at_k"]["4"] <= 1.0
        assert len(two["reward"]) == 2 and two["area"] == pytest.approx(stage_area(two["reward"]))
        assert two["accuracy"] is not None and one["max_excursion"] >= 0
        # stage 2 started from stage 1's final adapter, on task B, as its own run
        config = (Path(two["folder"]) / "config.yaml").read_text()
        assert "init_adapter" in config and Path(one["folder"]).name in config
        assert "max_digits: 2" in config
    assert set(summary["base"]["pass_at_k"]) == {"1", "4", "distinct"}
    assert (out / "plots" / "stage1_entropy.png").stat().st_size > 0
    assert (out / "plots" / "stage2_reward.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "goals (held against grpo, on each of 1 seed(s)" in printed
    assert max(len(line) for line in printed.splitlines() if "p@" in line) <= 100

    # a second B from the same stage 1: --stage1-from reuses the finished runs
    again = tmp_path / "again"
    argv = ["sequential", *TINY, "--out", str(again), "--runs", *runs, "--stage1-from", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    assert "(3 reused from" in capsys.readouterr().out  # pass@k on A is not scored again
    reused = json.loads((again / "summary.json").read_text())
    assert reused["base"] == summary["base"]
    for first, second in zip(summary["runs"], reused["runs"], strict=True):
        assert second["stage1"]["pass_at_k"] == first["stage1"]["pass_at_k"]
        assert second["stage1"]["entropy"] == first["stage1"]["entropy"]
        assert second["stage1"]["folder"] == first["stage1"]["folder"]
        assert str(again) in second["stage2"]["folder"]
        # the same start, seed and task B: the same stage 2
        assert second["stage2"]["reward"] == first["stage2"]["reward"]
    assert not (again / "stage1").exists()

    # stage 2 evaluated at every iteration: each run's held-out curve, its second-half mean,
    # the report's line and the curves' plot; the evaluations leave the training as it was
    curves = tmp_path / "curves"
    argv = ["sequential", *TINY, "--out", str(curves), "--runs", *runs, "--stage1-from", str(out),
            "--stage2-iterations", "3", "--stage2-eval-every", "1"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert "(not a goal) B accuracy over stage 2's second half, held - grpo: " in (
        capsys.readouterr().out
    )
    evaluated = json.loads((curves / "summary.json").read_text())
    for first, run in zip(summary["runs"], evaluated["runs"], strict=True):
        two = run["stage2"]
        assert [it for it, _ in two["accuracy_curve"]] == [0, 1, 2]
        assert two["accuracy_curve"][-1][1] == two["accuracy"]
        assert two["accuracy_late"] == pytest.approx(
            (two["accuracy_curve"][1][1] + two["accuracy_curve"][2][1]) / 2
        )
        assert two["reward"][:2] == first["stage2"]["reward"]
    assert (curves / "plots" / "stage2_accuracy.png").stat().st_size > 0
    assert not (again / "plots" / "stage2_accuracy.png").exists()

    # an `entrogym demo` out (seedS/RUN, a summary without a pair) is a stage 1 too; its
    # pass@k is scored again
    demo = tmp_path / "demo"
    shutil.copytree(out / "stage1", demo)
    demo_summary = {"settings": {"seeds": [0], "pass_tasks": 2, "pass_samples": 4}, "runs": []}
    (demo / "summary.json").write_text(json.dumps(demo_summary))
    from_demo = tmp_path / "from-demo"
    argv = ["sequential", *TINY, "--out", str(from_demo), "--runs", *runs,
            "--stage1-from", str(demo)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert f"reused from {demo}" in printed and "(3 reused from" not in printed
    scored = json.loads((from_demo / "summary.json").read_text())
    for first, second in zip(summary["runs"], scored["runs"], strict=True):
        assert second["stage1"]["folder"].startswith(str(demo))
        assert second["stage2"]["reward"] == first["stage2"]["reward"]
        assert second["stage1"]["pass_at_k"] == first["stage1"]["pass_at_k"]  # seeded sampling


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--task-b", "tests.vowel_env:test/Vowel-v0"], "no held-out 'test' split"),
        (["--task-b", "entrogym/NoSuch-v0"], "task_b 'entrogym/NoSuch-v0' is not a registered env"),
        (["--pair", "nope"], "unknown pair"),
        (["--pass-samples", "0"], "pass_samples must be >= 1"),
        (["--eval-samples", "0"], "eval_samples must be >= 1"),
        (["--stage2-eval-every", "-1"], "stage2_eval_every must be >= 0"),
        (["--runs", "grpo --algo.lever nope"], "runs:"),
    ],
)
def test_bad_input_is_one_line_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch, argv, message
) -> None:
    import entrogym.experiments.sequential as sequential

    def no_run(plan):  # reaching the run means the input was accepted
        raise AssertionError("the run started")

    monkeypatch.setattr(sequential, "run_sequential", no_run)
    assert main(["sequential", *TINY, "--out", str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_eval_samples_reach_every_evaluation_of_both_stages(tmp_path: Path) -> None:
    from entrogym.experiments.sequential import Plan

    grpo = parse_run("grpo")
    plan = Plan(tmp_path, "add1-add2", PAIRS["add1-add2"], [grpo], grpo, eval_samples=4)
    (one,) = plan.stage1_jobs()
    assert one.config.eval_samples == 4 and one.config.eval_tasks == 40
    folder = tmp_path / "stage1" / "seed0" / "grpo"
    (folder / "checkpoints" / "iter-000014" / "adapter").mkdir(parents=True)
    two = plan.stage2_job({"seed": 0, "label": "grpo", "folder": str(folder)})
    assert two.config.eval_samples == 4 and two.config.env_kwargs["max_digits"] == 2


def test_the_world_pairs_train_and_evaluate_with_the_worlds_settings(tmp_path: Path) -> None:
    """Either stage on the world gets its held-out split, the env's prompt (not the
    calculator's), one-line calls and its context; the arithmetic stage keeps the demo's."""
    from entrogym.experiments.sequential import Plan

    grpo = parse_run("grpo")
    world_first = Plan(tmp_path, "world-neg", PAIRS["world-neg"], [grpo], grpo)
    (one,) = world_first.stage1_jobs()
    assert one.config.env == "entrogym/World-v0" and one.config.eval_split == "test_normal"
    assert one.config.system_prompt is None and one.config.tool_format == "call"
    assert one.config.max_context_tokens == 2048 and one.config.micro_batch_size == 4
    folder = tmp_path / "stage1" / "seed0" / "grpo"
    (folder / "checkpoints" / "iter-000014" / "adapter").mkdir(parents=True)
    two = world_first.stage2_job({"seed": 0, "label": "grpo", "folder": str(folder)})
    assert two.config.env == "entrogym/Arithmetic-v0" and two.config.eval_split == "test"
    assert two.config.system_prompt is not None and two.config.max_context_tokens == 256
    math_first = Plan(tmp_path / "m", "neg-world", PAIRS["neg-world"], [grpo], grpo)
    two = math_first.stage2_job({"seed": 0, "label": "grpo", "folder": str(folder)})
    assert two.config.env == "entrogym/World-v0" and two.config.eval_split == "test_normal"
    assert two.config.tool_format == "call" and two.config.init_adapter is not None
    # the held-out counts are the world's test_normal split's (capped there)
    assert math_first.tasks_used()["eval_tasks_b"] == 40
    # the pairs' world settings are the multi-turn quickstart's
    import yaml

    config = Path(__file__).resolve().parents[2] / "examples/configs/world-quickstart.yaml"
    quickstart = yaml.safe_load(config.read_text())
    for key, value in PAIRS["neg-world"].b.settings.items():
        assert quickstart.get(key) == value or (key == "system_prompt" and key not in quickstart)


def test_a_world_pair_runs_through_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The world as task A: stage 1 and pass@k on its test_normal split, then the math task."""
    out = tmp_path / "seq"
    tiny = ["--model", "tiny-random-llama", "--stage1-iterations", "1", "--stage2-iterations",
            "1", "--eval-tasks", "2", "--pass-tasks", "2", "--pass-samples", "2", "--workers",
            "1"]  # fmt: skip
    argv = ["sequential", "--pair", "world-neg", *tiny, "--out", str(out), "--runs", "grpo"]
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pair"]["a"]["held_out"] == "test_normal"
    (run,) = summary["runs"]
    assert set(run["stage1"]["pass_at_k"]) == {"1", "2", "distinct"}
    evals = [json.loads(line) for line in (Path(run["stage1"]["folder"]) / "metrics.jsonl")
             .read_text().splitlines() if '"kind": "eval"' in line]  # fmt: skip
    assert evals and all(e["split"] == "test_normal" and "tgc" in e for e in evals)
    config = (Path(run["stage2"]["folder"]) / "config.yaml").read_text()
    assert "entrogym/Arithmetic-v0" in config and "init_adapter" in config


def test_labels_and_area() -> None:
    assert split_run("held=grpo --algo.lever entropy-bonus") == (
        "held",
        "grpo --algo.lever entropy-bonus",
    )
    assert split_run("grpo") == ("grpo", "grpo")
    assert stage_area([0.0, 1.0]) == 0.5
    assert stage_area([0.2, 0.4, 0.6]) == pytest.approx(0.4)
    assert stage_area([0.3]) == 0.3


def test_late_accuracy_is_the_mean_of_the_second_half() -> None:
    # 20 iterations (0-19) evaluated every 5: the second half is iterations 10, 15 and 19
    curve = [[0, 0.1], [5, 0.2], [10, 0.5], [15, 0.7], [19, 0.6]]
    assert late_accuracy(curve, 20) == pytest.approx((0.5 + 0.7 + 0.6) / 3)
    # first and last only: the last; an odd count keeps the middle iteration
    assert late_accuracy([[0, 0.1], [19, 0.6]], 20) == 0.6
    assert late_accuracy([[0, 0.1], [1, 0.3], [2, 0.5]], 3) == pytest.approx(0.4)
    assert late_accuracy([], 20) is None


def test_goals_compare_the_held_run_with_grpo_on_every_seed() -> None:
    def run(label, seed, b_acc, p16, exc):
        return {"label": label, "seed": seed,
                "stage1": {"pass_at_k": {"16": p16}, "max_excursion": exc},
                "stage2": {"accuracy": b_acc}}  # fmt: skip

    runs = [run("grpo", 0, 0.1, 0.90, 0.9), run("held", 0, 0.35, 0.97, 0.2),
            run("grpo", 1, 0.2, 0.90, 0.9), run("held", 1, 0.25, 0.93, 0.3)]  # fmt: skip
    result = goals({"held": "held", "runs": runs})
    assert result["stage2_mean_gain"] == pytest.approx(0.15)
    assert result["stage2"] is True  # mean 0.15 >= 0.10 and higher on both seeds
    assert result["pass16"] is False  # seed 1 gains only 0.03
    assert result["tracking"] is False  # seed 1 left the band by 0.30
    # without held-out curves there is no second-half comparison; with them, its mean
    assert result["stage2_late_mean_gain"] is None
    lates = iter([0.30, 0.50, 0.40, 0.45])
    for r in runs:
        r["stage2"]["accuracy_late"] = next(lates)
    late = goals({"held": "held", "runs": runs})
    assert [c["stage2_late_gain"] for c in late["checks"]] == pytest.approx([0.20, 0.05])
    assert late["stage2_late_mean_gain"] == pytest.approx(0.125)
    assert late["stage2"] is True  # the goal stays on the end point


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_every_registered_pair_makes_with_a_held_out_split(name: str) -> None:
    from entrogym.commands.sequential import check_task

    pair = PAIRS[name]
    for role, task in (("a", pair.a), ("b", pair.b)):
        check_task(role, task.env, task.env_kwargs, task.held_out)  # ValueError naming it
