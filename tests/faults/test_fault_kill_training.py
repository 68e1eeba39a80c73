"""kill -9 of a real (tiny) training run at several moments, one of them inside a checkpoint
write: the resumed run's metrics equal an uninterrupted run's, with no row lost or repeated."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import vowel_env  # registers test/Vowel-v0; TINY_RUN
from train_process import start_train

from entrogym.train.config import TrainConfig
from entrogym.train.folder.checkpoint import latest_checkpoint
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.trainer import train

ITERATIONS = 4
TINY = {**vowel_env.RESUMABLE_RUN, "checkpoint_every": 1}


def _start(out: Path, resume: bool, kill_in_save: int = 0) -> subprocess.Popen:
    """The CLI, with an optional SIGKILL of itself inside its ``kill_in_save``-th checkpoint
    save (files written and fsynced, folder not yet renamed into place)."""
    fault = f"kill-in-save:{kill_in_save}" if kill_in_save else ""
    return start_train(out, TINY, ITERATIONS, resume=resume, fault=fault)


def _kill_after_resume(p: subprocess.Popen, delay: float) -> str:
    """Wait for the run to say it resumed, then SIGKILL it ``delay`` seconds later."""
    seen = []
    for line in p.stdout:
        seen.append(line)
        if "resuming" in line:
            break
    time.sleep(delay)
    os.kill(p.pid, signal.SIGKILL)
    seen.append(p.communicate(timeout=60)[0])
    return "".join(seen)


def test_kill_9_at_random_moments_then_resume_equals_uninterrupted_run(tmp_path):
    reference = read_metrics(
        train(TrainConfig(out=str(tmp_path / "ref"), iterations=ITERATIONS, **TINY))
    )
    run = tmp_path / "killed"
    rng = random.Random(1234)  # the "random" moments, reproducible

    # 1. Killed inside the save of iteration 1 (files written, folder not yet renamed).
    p = _start(run, resume=False, kill_in_save=2)
    output = p.communicate(timeout=600)[0]
    assert p.returncode == -signal.SIGKILL, output[-3000:]
    assert latest_checkpoint(run).name == "iter-000000"
    assert [r["iteration"] for r in read_metrics(run)] == [0, 1]  # row 1 is past the checkpoint

    # 2. Resumed, killed at a random moment; 3. resumed, killed inside its first save.
    p = _start(run, resume=True)
    output = _kill_after_resume(p, delay=rng.uniform(0.0, 3.0))
    assert "after iteration 0" in output, output[-3000:]
    p = _start(run, resume=True, kill_in_save=1)
    output = p.communicate(timeout=600)[0]
    assert p.returncode in (-signal.SIGKILL, 0), output[-3000:]

    # 4. Resumed to the end.
    p = _start(run, resume=True)
    output = p.communicate(timeout=600)[0]
    assert p.returncode == 0, output[-3000:]
    got = read_metrics(run)
    assert [r["iteration"] for r in got] == list(range(ITERATIONS))  # none lost, none repeated
    for want, have in zip(reference, got, strict=True):
        for key in ("entropy", "reward_mean", "loss", "zeta", "approx_kl", "cumulative_entropy"):
            assert have[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (key, want, have)
    assert latest_checkpoint(run).name == f"iter-{ITERATIONS - 1:06d}"
    assert len(list((run / "adapters").iterdir())) <= 2
