"""Two writers on one run folder: the second fails at once naming the holder; a dead holder
does not block."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrogym.train.config import TrainConfig
from entrogym.train.folder.safety import RunFolderBusy, RunLock, open_run_folder

REPO = Path(__file__).resolve().parents[2]
HOLD = (
    "import sys, time; from entrogym.train.folder.safety import RunLock; "
    "lock = RunLock(sys.argv[1]); print('locked', flush=True); time.sleep(600)"
)


def _holder(folder: Path) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "locked"
    return p


def _config(folder: Path, **kw) -> dict:
    return TrainConfig(out=str(folder), env="test/Vowel-v0", **kw).to_dict()


def test_second_writer_in_this_process_is_refused(tmp_path):
    first = open_run_folder(tmp_path, _config(tmp_path), resume=False)
    with pytest.raises(RunFolderBusy, match=f"pid {os.getpid()}"):
        open_run_folder(tmp_path, _config(tmp_path), resume=True)
    first.release()
    open_run_folder(tmp_path, _config(tmp_path), resume=True).release()  # free again


def test_holder_killed_with_sigkill_does_not_block(tmp_path):
    p = _holder(tmp_path)
    try:
        with pytest.raises(RunFolderBusy, match=f"another entrogym process \\(pid {p.pid}\\)"):
            RunLock(tmp_path)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    lock = RunLock(tmp_path)  # the kernel dropped the dead holder's lock
    assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())
    lock.release()


def test_second_trainer_fails_fast_before_loading_a_model(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    p = _holder(run)
    try:
        args = ["train", "--env", "test/Vowel-v0", "--model", "tiny-random-llama", "--engine"]
        args += ["hf", "--engine-dtype", "fp32", "--out", str(run), "--seed", "1"]
        args += ["--tasks-per-iter", "2"]  # within the 6 tasks of test/Vowel-v0
        code = (
            "import sys; sys.path.insert(0, 'tests'); import vowel_env; "
            "from entrogym.cli import main; sys.exit(main(sys.argv[1:]))"
        )
        t0 = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True
        )
        elapsed = time.monotonic() - t0
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert done.returncode != 0
    assert f"pid {p.pid}" in done.stderr and "only one trainer" in done.stderr
    assert "resuming" not in done.stdout and not (run / "metrics.jsonl").exists()
    assert not (run / "adapters").exists()  # refused before the policy was built
    assert elapsed < 120  # interpreter start and imports only (a loaded 2-core box)


FORK_THEN_HOLD = (
    "import os, sys, time; from entrogym.train.folder.safety import RunLock; "
    "lock = RunLock(sys.argv[1]); child = os.fork()\n"
    "if child == 0: os.write(1, b'ready\\n'); time.sleep(600); os._exit(0)\n"
    "os.write(1, f'{child}\\n'.encode()); time.sleep(600)"
)


def test_forked_child_of_a_killed_trainer_does_not_keep_the_folder_locked(tmp_path):
    p = subprocess.Popen(
        [sys.executable, "-c", FORK_THEN_HOLD, str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    # the child prints once its after-fork hook has run (it may run after the parent's print)
    lines = {p.stdout.readline().strip(), p.stdout.readline().strip()}
    child = int((lines - {"ready"}).pop())
    try:
        with pytest.raises(RunFolderBusy, match=f"pid {p.pid}"):
            RunLock(tmp_path)
        os.kill(p.pid, signal.SIGKILL)  # the trainer dies; its forked worker lives on
        p.wait()
        os.kill(child, 0)  # still alive
        RunLock(tmp_path).release()  # yet the folder is free
    finally:
        os.kill(child, signal.SIGKILL)
