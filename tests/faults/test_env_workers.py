"""Envs run in worker processes (finding 1): a hanging, leaking or crashing env fails its
episodes as env errors naming env, task and what happened; its worker is replaced and the run
goes on. ``--env-workers 0`` runs envs in the trainer's process.

The hanging and crashing envs run through the real ``entrogym train`` in a subprocess, so a
regression cannot hang or kill the test process itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import hostile_envs  # noqa: F401  (registers faults/Hostile-v0)
import psutil
import pytest
from vowel_env import TINY_SETTINGS

from entrogym.agents.rollout import collect_rollouts
from entrogym.algos import get_algorithm
from entrogym.train.config import TrainConfig
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.trainer import train

REPO = Path(__file__).resolve().parents[2]
FAULTS = Path(__file__).resolve().parent
ENV = "hostile_envs:faults/Hostile-v0"
# all four tasks every iteration, two samples each: t0 is always in the batch
RUN = {**TINY_SETTINGS, "tasks_per_iter": 4, "max_env_error_fraction": 0.5}


def _cli(out: Path, fault: str, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    args = ["train", "--env", ENV, "--env-kwargs", f"{{fault: {fault}}}", "--out", str(out)]
    for key, value in {**RUN, "iterations": 2}.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAULTS), str(REPO / "tests")])}
    return subprocess.run(
        [sys.executable, "-m", "entrogym", *args, *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_hanging_step_times_out_and_the_run_goes_on(tmp_path: Path) -> None:
    t0 = time.monotonic()
    done = _cli(tmp_path / "run", "hang", "--env-timeout", "3", "--env-workers", "8")
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - t0 < 240
    rows = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    assert [r["iteration"] for r in rows] == [0, 1]
    assert [r["env_errors"] for r in rows] == [2, 2]  # t0's two samples, nothing else
    assert [r["episodes"] for r in rows] == [6, 6]
    assert (
        f"env {ENV!r}, task 't0', step: EnvTimeout: no reply within 3 s (--env-timeout); "
        "its env worker was stopped and replaced"
    ) in done.stderr


@pytest.mark.parametrize("fault", ["crash", "exit"])
def test_a_dying_env_fails_its_episode_and_its_worker_is_replaced(
    tmp_path: Path, fault: str
) -> None:
    done = _cli(tmp_path / "run", fault, "--env-workers", "8")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    assert [r["env_errors"] for r in rows] == [2, 2]
    how = "killed by SIGKILL" if fault == "crash" else "exit code 3"
    assert (
        f"env {ENV!r}, task 't0', step: EnvWorkerDied: the env worker process died ({how})"
    ) in done.stderr


def test_a_leaking_env_is_stopped_by_its_memory_limit(tmp_path: Path, capfd) -> None:
    def run(out: str, **kwargs: object) -> Path:
        return train(
            TrainConfig(
                env=ENV,
                env_max_memory_mb=1024,
                env_workers=2,
                algo=get_algorithm("rloo"),
                out=str(tmp_path / out),
                **{**RUN, "max_env_error_fraction": 1.0, **kwargs},
            )
        )

    run("warm-up", iterations=1)  # loads the model and the workers: not the leak's growth
    me = psutil.Process()
    before = me.memory_info().rss
    # t0's two samples a step each leak 400 MB in t0's worker, whatever else the worker holds:
    # three leaks pass 1024 MB, so a worker holds at most two (however large its own imports
    # are on this machine) and six leaks in three iterations fail at least two episodes.
    # t1..t3 leak nothing, so every iteration trains on something.
    leak = {"fault": "leak", "broken": ["t0"], "leak_mb": 400}
    out = run("leak", iterations=3, env_kwargs=leak)
    grown = me.memory_info().rss - before
    rows = [r for r in read_metrics(out) if r["kind"] == "train"]
    assert len(rows) == 3
    # in the trainer's process the six leaks would have kept 2.4 GB; each worker's limit stops
    # its leak, and a replacement takes its place
    assert grown < 200 * 2**20, grown
    assert sum(r["env_errors"] for r in rows) >= 2
    assert all(r["episodes"] >= 1 for r in rows)
    assert (
        "step: MemoryError: out of memory (the env worker's address space is limited to "
        "1024 MB, --env-max-memory-mb)"
    ) in capfd.readouterr().err


def test_a_hanging_reset_is_bounded_too(tmp_path: Path) -> None:
    done = _cli(tmp_path / "run", "hang-reset", "--env-timeout", "3", "--env-workers", "8")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "task 't0', reset: EnvTimeout: no reply within 3 s" in done.stderr


@pytest.mark.parametrize("workers", [0, 2])
def test_env_workers_zero_runs_envs_in_this_process(engine, agent, workers: int) -> None:
    eps = collect_rollouts(
        ENV, ["t1", "t2"], engine, agent, k=2, early_stop=False, env_workers=workers
    )
    pids = {e.info["pid"] for e in eps}
    assert eps.stats["env_errors"] == 0 and len(eps) == 4
    if workers == 0:
        assert pids == {os.getpid()}
    else:
        assert os.getpid() not in pids and 1 <= len(pids) <= workers


def test_a_user_env_from_the_examples_trains_in_workers(tmp_path: Path) -> None:
    """examples/custom_env.py through the command a user types, envs in worker processes."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "examples")}
    args = ["train", "--env", "custom_env:examples/Unscramble-v0", "--algo", "grpo"]
    args += ["--out", str(tmp_path / "run"), "--iterations", "1", "--env-workers", "2"]
    for key, value in TINY_SETTINGS.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(
        [sys.executable, "-m", "entrogym", *args],
        cwd=tmp_path,  # not the repository: the module comes from PYTHONPATH alone
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = read_metrics(tmp_path / "run")
    assert row["env_errors"] == 0 and row["episodes"] == 4
