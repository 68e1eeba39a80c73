"""An honest ``entrogym sequential``: ``--stage1-from`` reuses a stage 1 only when it is this
experiment's (task A and its kwargs, each run's full spec, the model, the iterations and the
seeds), refusing any difference in one line before any model loads; the summary records the
task counts actually used and says "not measured" for a pass@k it never measured; a stopped
experiment continues from its finished jobs with ``--resume``; a SIGTERM is exit code 143 and
one line, with any worker count; an ``--out`` that is a file is one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrogym.cli import main
from entrogym.commands.demo_runs import parse_run
from entrogym.experiments.sequential import PAIRS, Plan, Task, TaskPair, summarize
from entrogym.experiments.sequential_report import goals, report

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny-random-llama", "--stage1-iterations", "2", "--stage2-iterations", "2",
        "--eval-tasks", "2", "--pass-tasks", "2", "--pass-samples", "4", "--workers", "1"]  # fmt: skip
HELD = "held=grpo --algo.lever entropy-bonus --algo.controller paper"


@pytest.fixture
def no_run(monkeypatch):
    """Reaching the experiment's run means the input was accepted."""
    import entrogym.experiments.sequential as sequential

    def refuse(plan):
        raise AssertionError("the run started")

    monkeypatch.setattr(sequential, "run_sequential", refuse)


def test_an_out_that_is_a_file_is_one_line(tmp_path: Path, capsys, no_run) -> None:
    out = tmp_path / "notes.txt"
    out.write_text("mine\n")
    assert main(["sequential", *TINY, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file" in err[0] and str(out) in err[0], err
    assert out.read_text() == "mine\n"


def _finished_stage1(root: Path, *, runs: list[str], task_a: Task, model: str,
                     iterations: int = 2, seeds: tuple[int, ...] = (0,)) -> Path:  # fmt: skip
    """A stage 1 on disk as ``entrogym sequential`` leaves it, without training: each run's
    config.yaml (as its trainer writes it), metrics and last checkpoint."""
    import yaml

    pair = TaskPair(task_a, PAIRS["add1-add2"].b, "test")
    plan = Plan(root, "custom", pair, [parse_run(r) for r in runs], parse_run("grpo"),
                seeds=list(seeds), stage1_iterations=iterations, model=model)  # fmt: skip
    for job in plan.stage1_jobs():
        folder = Path(job.config.out)
        (folder / "checkpoints" / f"iter-{iterations - 1:06d}" / "adapter").mkdir(parents=True)
        (folder / "config.yaml").write_text(yaml.safe_dump(job.config.to_dict()))
        (folder / "metrics.jsonl").write_text("")
    return root


ADD1 = PAIRS["add1-add2"].a
CASES = [
    ("task A's kwargs", dict(task_a=Task(ADD1.env, {**ADD1.env_kwargs, "num_train": 50})),
     "env_kwargs"),
    ("a run's spec under the same label",
     dict(runs=["grpo", "held=grpo --algo.lever entropy-bonus --algo.controller fixed"]), "algo"),
    ("the model", dict(model="tiny-random-qwen3"), "model"),
    ("the iterations", dict(iterations=3), "iterations"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "change", "field"), CASES, ids=[c[0] for c in CASES])
def test_stage1_from_refuses_another_experiments_stage1(
    what: str, change: dict, field: str, tmp_path: Path, capsys, no_run
) -> None:
    settings = dict(runs=["grpo", HELD], task_a=ADD1, model="tiny-random-llama")
    previous = _finished_stage1(tmp_path / "previous", **{**settings, **change})
    out = tmp_path / "again"
    argv = ["sequential", *TINY, "--out", str(out), "--runs", "grpo", HELD,
            "--stage1-from", str(previous)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("entrogym sequential: error: stage1_from:"), err
    assert field in err[0], err
    assert not out.exists()


def test_stage1_from_takes_its_own_stage1(tmp_path: Path, monkeypatch) -> None:
    import entrogym.experiments.sequential as sequential

    previous = _finished_stage1(tmp_path / "previous", runs=["grpo", HELD], task_a=ADD1,
                                model="tiny-random-llama")  # fmt: skip
    started = []
    monkeypatch.setattr(sequential, "run_sequential", started.append)
    argv = ["sequential", *TINY, "--out", str(tmp_path / "again"), "--runs", "grpo", HELD,
            "--stage1-from", str(previous), "--eval-samples", "4"]  # fmt: skip
    assert main(argv) == 0 and len(started) == 1  # eval settings may differ


def test_the_summary_records_the_task_counts_used_and_what_was_not_measured(
    tmp_path: Path,
) -> None:
    grpo = parse_run("grpo")
    plan = Plan(tmp_path, "add1-add2", PAIRS["add1-add2"], [grpo], grpo, eval_tasks=100,
                pass_tasks=100, pass_samples=4)  # fmt: skip
    summary = summarize(plan, [], [], 0.0)
    assert summary["settings"]["eval_tasks"] == 100  # what was asked
    assert summary["tasks_used"] == {"eval_tasks_a": 40, "eval_tasks_b": 40, "pass_tasks_a": 40}

    def run(label, b_acc):
        return {"label": label, "seed": 0,
                "stage1": {"pass_at_k": {"1": 0.5, "4": 0.8}, "max_excursion": 0.1,
                           "entropy": [1.0, 1.0]},
                "stage2": {"accuracy": b_acc, "accuracy_first": 0.1, "area": 0.2}}  # fmt: skip

    summary["runs"] = [run("grpo", 0.1), run("held", 0.3)]
    summary["held"] = "held"
    assert goals(summary)["pass16"] is None  # pass@16 was never measured with 4 samples
    text = report(summary)
    line = next(line for line in text.splitlines() if "pass@16 on A" in line)
    assert "not measured" in line and "NOT met" not in line, line


def _sequential(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "entrogym", "sequential", *TINY, "--runs", "grpo",
            "--out", str(out), *extra]  # fmt: skip


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_group_sigterm_is_143_and_one_line(workers: str, tmp_path: Path) -> None:
    out = tmp_path / "seq"
    argv = [*_sequential(out), "--workers", workers, "--stage1-iterations", "40"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list(out.glob("stage1/seed0/grpo/metrics.jsonl")):
            time.sleep(0.5)  # stage 1 is training
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    assert "Traceback" not in err, err
    mine = [line for line in err.splitlines() if line.startswith("entrogym sequential:")]
    assert len(mine) == 1 and "--resume" in mine[0], err


def test_a_stopped_experiment_resumes_from_its_finished_jobs(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    import entrogym.experiments.sequential as sequential

    real, ran = sequential.run_sequential_job, []

    def stage2_fails_once(job):
        ran.append((type(job).__name__, job.label, getattr(job, "stage", None)))
        if getattr(job, "stage", None) == 2 and ran.count(ran[-1]) == 1:
            from dataclasses import replace

            from entrogym.train.trainer import train

            train(replace(job.config, iterations=1))  # stopped after its first checkpoint
            raise RuntimeError("stopped")
        return real(job)

    monkeypatch.setattr(sequential, "run_sequential_job", stage2_fails_once)
    out = tmp_path / "seq"
    argv = ["sequential", *TINY, "--runs", "grpo", "--out", str(out)]
    with pytest.raises(RuntimeError, match="stopped"):
        main(argv)
    assert main(argv) == 2  # the same command refuses the folder, naming --resume
    assert "--resume" in capsys.readouterr().err
    before = list(ran)
    assert main([*argv, "--resume"]) == 0, capsys.readouterr().err
    again = ran[len(before) :]
    # stage 1 finished before the stop and is not run again; the rest runs once each
    assert before[0] == ("TrainJob", "grpo", 1) and before[0] not in again, again
    unfinished = [
        ("TrainJob", "grpo", 2),
        ("PassJob", "grpo", None),
        ("PassJob", "base model", None),
    ]
    assert sorted(again, key=str) == sorted(unfinished, key=str), again
    summary = json.loads((out / "summary.json").read_text())
    assert [r["label"] for r in summary["runs"]] == ["grpo"]
    assert len(summary["runs"][0]["stage2"]["reward"]) == 2
    # the stopped stage-2 run went on from its checkpoint
    history = Path(summary["runs"][0]["stage2"]["folder"]) / "config_history.jsonl"
    events = [json.loads(line)["event"] for line in history.read_text().splitlines()]
    assert events == ["start", "resume"], events
    assert main([*argv, "--resume", "--lr", "0.001"]) == 2  # another experiment
    assert "lr" in capsys.readouterr().err
