"""Preemption as schedulers send it: SIGTERM to the whole process group (SLURM, Kubernetes), so
the env workers get it too, at every stage of a run. The workers ignore it; the trainer
checkpoints every iteration it logged, says so in one line and exits 143; the run history
records an interruption (never an env-error stop); and a resume goes on from there. A second
signal (Ctrl-C twice) ends a sync and an async run alike: exit 130, an ``interrupted`` entry,
no abort. An env worker orphaned by ``kill -9`` of its trainer exits without a word.

The signals are sent from inside the run at the named moments (``train_process``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import vowel_env  # RESUMABLE_RUN
from train_process import REPO, start_train

from entrogym.train.folder.checkpoint import latest_checkpoint, read_meta
from entrogym.train.folder.metrics import read_metrics

SETTINGS = {**vowel_env.RESUMABLE_RUN, "env": "vowel_env:test/Vowel-v0", "checkpoint_every": 2}
ITERATIONS = 5


def _history(run: Path) -> list[dict]:
    lines = (run / "config_history.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _check_stopped(
    run: Path, p: subprocess.Popen, code: int, saved: int | None, all_saved: bool = True
) -> str:
    """The run exited ``code`` with one line saying so, the history records an interruption,
    the newest checkpoint is of iteration ``saved`` and (``all_saved``) holds every iteration
    the run logged."""
    output = p.communicate(timeout=600)[0]
    assert p.returncode == code, output
    assert "interrupted; resume with --resume" in output, output
    for sign in ("Traceback", "env error", "terminate called"):
        assert sign not in output, output
    event = _history(run)[-1]
    assert event["event"] == "interrupted", event
    assert event["saved_iteration"] == saved, event
    ckpt = latest_checkpoint(run)
    assert (None if ckpt is None else read_meta(ckpt)["iteration"]) == saved
    if all_saved:
        rows = read_metrics(run) if (run / "metrics.jsonl").exists() else []
        assert [r["iteration"] for r in rows] == list(range(0 if saved is None else saved + 1))
    return output


def test_sigterm_to_the_group_at_every_stage_checkpoints_exits_143_and_resumes(tmp_path: Path):
    run = tmp_path / "run"
    # (fault, the iteration checkpointed when it stops); each stage resumes the one before
    stages = [
        ("term-at-startup", None),  # while the policy loads
        # both env workers of iteration 0 (one per task) are still importing: every episode
        # fails in them unless they ignore the signal
        ("term-at-worker-start:2", None),
        ("term-in-rollouts:8", 0),  # iteration 1's rollouts (6 env steps an iteration)
        ("term-in-update:2", 2),  # the update is finished, then checkpointed (not due)
        ("term-in-save", 3),  # the checkpoint of iteration 3 (due) completes
    ]
    for i, (fault, saved) in enumerate(stages):
        p = start_train(run, SETTINGS, ITERATIONS, resume=i > 0, fault=fault)
        _check_stopped(run, p, 143, saved)
    p = start_train(run, SETTINGS, ITERATIONS, resume=True)
    output = p.communicate(timeout=600)[0]
    assert p.returncode == 0, output
    assert [r["iteration"] for r in read_metrics(run)] == list(range(ITERATIONS))
    stops = [e["event"] for e in _history(run) if e["event"] in ("interrupted", "stopped")]
    assert stops == ["interrupted"] * len(stages)


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_ctrl_c_twice_stops_at_once_records_it_and_resumes(tmp_path: Path, max_staleness: int):
    run = tmp_path / "run"
    settings = {**SETTINGS, "max_staleness": max_staleness}
    p = start_train(run, settings, 3, fault="int-twice-in-update:1")
    # not SIGABRT (-6) from a rollout thread that outlived the run; iteration 0 was logged but
    # not due for a checkpoint, and is redone
    output = _check_stopped(run, p, 130, None, all_saved=False)
    assert "stopped at once" in output, output

    p = start_train(run, settings, 3, resume=True)
    output = p.communicate(timeout=600)[0]
    assert p.returncode == 0, output
    assert [r["iteration"] for r in read_metrics(run)] == [0, 1, 2]


ORPHAN = """
import os, signal
import hostile_envs
from entrogym.agents.env_workers import EnvLimits, EnvWorkers
env = EnvWorkers(EnvLimits(workers=1)).make("faults/Hostile-v0", {"fault": "slow"})
env.reset(seed=0, options={"task_id": "t0"})
env.host.proc.send(("step", env.handle, ("x",)))  # its reply comes in half a second
print("killed", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_an_env_worker_orphaned_by_kill_9_exits_quietly() -> None:
    pythonpath = os.pathsep.join(str(p) for p in (REPO, REPO / "tests" / "faults"))
    p = subprocess.Popen(
        [sys.executable, "-c", ORPHAN],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": pythonpath},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # the worker's stderr too: EOF once it has exited
        text=True,
    )
    output = p.communicate(timeout=60)[0]
    assert output == "killed\n"  # not a BrokenPipeError (twice) from the worker's reply
