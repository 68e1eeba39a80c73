"""The demo's job pool (``entrogym.experiments.run``): runs side by side in spawned processes give what
the same run gives in this process, and a failing job stops the demo with its error.

The SmolLM2 demo itself is ``make demo`` (minutes); here the pool runs tiny-random-llama on
the vowel env (``module:id`` so that the spawned workers register it themselves)."""

from __future__ import annotations

from pathlib import Path

import pytest
from vowel_env import TINY_RUN

from entrogym.experiments.pool import run_jobs
from entrogym.experiments.run import Job, announce_demo, run_job
from entrogym.train.config import TrainConfig


def tiny(out: Path, seed: int, **extra) -> TrainConfig:
    run = {**TINY_RUN, "env": "tests.vowel_env:test/Vowel-v0", "iterations": 2, **extra}
    return TrainConfig(out=str(out / f"s{seed}"), seed=seed, threads=1, **run)


def test_pool_runs_match_in_process_runs(tmp_path: Path) -> None:
    jobs = [Job("repo-r", seed, 1, tiny(tmp_path / "pool", seed)) for seed in (0, 1)]
    pooled = run_jobs(jobs, 2, run_job, announce_demo)
    alone = run_jobs([Job("repo-r", 1, 1, tiny(tmp_path / "alone", 1))], 1, run_job, announce_demo)
    assert [r["seed"] for r in pooled] == [0, 1]
    assert all(len(r["entropy"]) == 2 and r["algo"] == "repo-r" for r in pooled)
    assert pooled[1]["entropy"] == alone[0]["entropy"]  # same seed, same numbers
    assert pooled[0]["entropy"] != pooled[1]["entropy"]
    assert all((Path(r["folder"]) / "metrics.jsonl").exists() for r in pooled)


def test_a_failing_job_stops_the_demo_with_its_error(tmp_path: Path) -> None:
    bad = tiny(tmp_path, 0, env="tests.vowel_env:test/NoSuchEnv-v0")
    with pytest.raises(ValueError, match="NoSuchEnv"):
        run_jobs(
            [Job("bad", 0, 1, bad), Job("ok", 1, 1, tiny(tmp_path, 1))], 2, run_job, announce_demo
        )


def test_the_demo_scores_each_run_as_it_ends(tmp_path: Path) -> None:
    """``run_demo`` on tiny-random-llama: every run's pass@k is queued as its own follow-up
    (the pool's order), the base model's is scored beside the runs, and each lands in its
    run's record."""
    from entrogym.commands.demo_runs import parse_run
    from entrogym.experiments.run import run_demo

    runs = [parse_run("grpo"), parse_run("held=grpo --algo.lever entropy-bonus")]
    summary = run_demo(tmp_path / "demo", runs, 2, 1e-3, 2, workers=3, pass_tasks=2,
                       pass_samples=2, model="tiny-random-llama")  # fmt: skip
    assert [r["label"] for r in summary["runs"]] == ["grpo", "held"]
    for record in summary["runs"]:
        assert set(record["pass_at_k"]) == {"1", "2", "distinct"}
        assert 0.0 <= record["pass_at_k"]["1"] <= record["pass_at_k"]["2"] <= 1.0
        assert len(record["entropy"]) == 2 and Path(record["folder"]).name in {"grpo", "held"}
    assert set(summary["base_pass_at_k"]) == {"1", "2", "distinct"}
    assert summary["accuracy_before"] is not None
