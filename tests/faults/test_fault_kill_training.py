"""kill -9 of a real (tiny) training run at several moments, one of them inside a checkpoint
write: the resumed run's metrics equal an uninterrupted run's, with no row lost or repeated."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import vowel_env  # registers test/Vowel-v0; TINY_RUN

from entrogym.train.checkpoint import latest_checkpoint
from entrogym.train.config import TrainConfig
from entrogym.train.metrics import read_metrics
from entrogym.train.trainer import train

REPO = Path(__file__).resolve().parents[2]
ITERATIONS = 4
TINY = {**vowel_env.RESUMABLE_RUN, "checkpoint_every": 1}
# The CLI, with an optional SIGKILL of itself right after the KILL_IN_SAVE-th checkpoint's
# files are written and fsynced, before the folder is renamed into place.
LAUNCH = """
import os, signal, sys
sys.path.insert(0, "tests")
import vowel_env
kill_at = int(os.environ.get("KILL_IN_SAVE", "0"))
if kill_at:
    from entrogym.train import checkpoint
    real, calls = checkpoint._fsync_tree, [0]
    def fsync_then_die(root):
        real(root)
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    checkpoint._fsync_tree = fsync_then_die
from entrogym.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _start(out: Path, resume: bool, kill_in_save: int = 0) -> subprocess.Popen:
    args = ["train", "--out", str(out), "--iterations", str(ITERATIONS)]
    for key, value in TINY.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    if resume:
        args += ["--resume", "true"]
    env = {**os.environ, "KILL_IN_SAVE": str(kill_in_save)}
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


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
