"""SIGTERM and Ctrl-C (finding 9): the trainer finishes or abandons the iteration in progress,
writes a checkpoint of every iteration it logged, says how to resume and exits 143 (SIGTERM)
or 130 (SIGINT). The resumed run equals an uninterrupted one; no completed iteration is lost,
although checkpoints are otherwise written only every 50 iterations.

Two envs: ``test/Vowel-v0`` (single-turn; the signal lands wherever the run is) and the
hostile env's ``slow`` fault (three half-second turns per episode: a signal sent half a
second into an iteration lands in its rollouts, which are abandoned; iteration 0 is saved
with the random state it ended with)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import hostile_envs  # noqa: F401  (registers faults/Hostile-v0)
import pytest
import vowel_env  # registers test/Vowel-v0; RESUMABLE_RUN

from entrogym.train.config import TrainConfig
from entrogym.train.folder.checkpoint import latest_checkpoint, read_meta
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.trainer import train

REPO = Path(__file__).resolve().parents[2]
ITERATIONS = 4
TINY = {**vowel_env.RESUMABLE_RUN, "checkpoint_every": 50}
SETUPS = {
    "vowel": {"env": "vowel_env:test/Vowel-v0"},
    "slow": {
        "env": "hostile_envs:faults/Hostile-v0",
        "env_kwargs": "{fault: slow, broken: [t0, t1, t2, t3]}",
    },
}
KEYS = ("entropy", "reward_mean", "loss", "zeta", "approx_kl", "cumulative_entropy")


def _settings(setup: str) -> dict:
    return {**TINY, **SETUPS[setup]}


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    out = {}
    for setup in SETUPS:
        settings = _settings(setup)
        settings["env"] = settings["env"].partition(":")[2]  # registered here by the imports
        if "env_kwargs" in settings:
            settings["env_kwargs"] = {"fault": "slow", "broken": ["t0", "t1", "t2", "t3"]}
        folder = tmp_path_factory.mktemp(setup)
        out[setup] = read_metrics(train(TrainConfig(out=str(folder), iterations=ITERATIONS,
                                                    **settings)))  # fmt: skip
    return out


def _start(out: Path, setup: str, resume: bool = False) -> subprocess.Popen:
    args = ["train", "--out", str(out), "--iterations", str(ITERATIONS)]
    args += vowel_env.option_words(_settings(setup))
    if resume:
        args += ["--resume"]
    pythonpath = os.pathsep.join([str(REPO / "tests"), str(REPO / "tests" / "faults")])
    return subprocess.Popen(
        [sys.executable, "-m", "entrogym", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": pythonpath},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _signal_after(p: subprocess.Popen, line_start: str, delay: float, sig: int) -> str:
    """Wait for a line starting with ``line_start``, then send ``sig`` ``delay`` s later."""
    seen = []
    assert p.stdout is not None
    for line in p.stdout:
        seen.append(line)
        if line.startswith(line_start):
            break
    time.sleep(delay)
    sent = time.monotonic()
    p.send_signal(sig)
    seen.append(p.communicate(timeout=120)[0])
    assert time.monotonic() - sent < 30  # within --shutdown-grace (30 s)
    return "".join(seen)


@pytest.mark.parametrize(
    ("setup", "sig", "code", "delay"),
    [
        ("vowel", signal.SIGTERM, 143, 0.0),  # at once: inside iteration 1
        ("vowel", signal.SIGINT, 130, 0.2),
        ("slow", signal.SIGTERM, 143, 0.5),  # inside iteration 1's rollouts
    ],
)
def test_a_signal_mid_run_checkpoints_and_the_resumed_run_is_exact(
    references: dict[str, list[dict]],
    tmp_path: Path,
    setup: str,
    sig: int,
    code: int,
    delay: float,
) -> None:
    run = tmp_path / "run"
    p = _start(run, setup)
    output = _signal_after(p, "[repo-r] iter 0", delay, sig)
    assert p.returncode == code, output[-3000:]
    assert "interrupted; resume with --resume" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    rows = read_metrics(run)
    ckpt = latest_checkpoint(run)
    assert rows and ckpt is not None, output[-3000:]
    # every iteration that was logged is in the checkpoint: nothing completed is lost
    assert read_meta(ckpt)["iteration"] == rows[-1]["iteration"]
    if setup == "slow":
        assert [r["iteration"] for r in rows] == [0]  # iteration 1 was abandoned

    p = _start(run, setup, resume=True)
    output = p.communicate(timeout=600)[0]
    assert p.returncode == 0, output[-3000:]
    got = read_metrics(run)
    assert [r["iteration"] for r in got] == list(range(ITERATIONS))
    for want, have in zip(references[setup], got, strict=True):
        for key in KEYS:
            assert have[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (key, want, have)
