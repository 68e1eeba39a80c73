"""Trackers that cannot do their job cost a run seconds, not minutes, and lose nothing: the real
wandb with an API key and no server to reach (it falls back to offline, in the run folder), the
real MLflow against a server that accepts connections and never answers, and a local store
that cannot be written, refused before the model loads."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tracker_records import expected, same, wandb_history

from entrogym.commands.train import cli
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.folder.trackers import START_TIMEOUT_S

TESTS = Path(__file__).resolve().parents[1]
ARGS = ["--env", "vowel_env:test/Vowel-v0", "--model", "tiny-random-llama", "--engine", "hf",
        "--engine-dtype", "fp32", "--iterations", "1", "--tasks-per-iter", "2", "--samples", "2",
        "--early-stop-min-per-task", "2", "--max-response-tokens", "4",
        "--max-context-tokens", "128", "--threads", "1"]  # fmt: skip


@pytest.fixture
def silent_server() -> Iterator[str]:
    """The URL of a server that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _closed_port_url() -> str:
    """The URL of a port nothing listens on: connections are refused, as with no network."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_tracker_servers_out_of_reach_cost_seconds_and_wandb_keeps_a_copy(
    tmp_path: Path, silent_server: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    env |= {"PYTHONPATH": str(TESTS), "HF_HUB_OFFLINE": "1",
            "WANDB_API_KEY": "0" * 40, "WANDB_BASE_URL": _closed_port_url(),  # online, no net
            "MLFLOW_TRACKING_URI": silent_server}  # fmt: skip
    run_dir = tmp_path / "run"
    argv = [*ARGS, "--out", str(run_dir), "--report-to", "wandb,mlflow"]
    t0 = time.monotonic()
    # each library alone retries for 90-100 s; the run itself takes about 20 s here
    done = subprocess.run([sys.executable, "-m", "entrogym", "train", *argv], env=env,
                          capture_output=True, text=True, timeout=100)  # fmt: skip
    took = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "wandb: could not start online" in done.stderr
    assert f"wandb runs offline in {run_dir / 'wandb'}" in done.stderr
    assert "--report-to mlflow failed at start" in done.stderr
    assert took < 70, took
    # wandb's offline copy holds every row of metrics.jsonl
    assert same(wandb_history(run_dir), expected(read_metrics(run_dir)))


def test_the_start_up_bound_is_a_few_seconds() -> None:
    assert 1 <= START_TIMEOUT_S <= 10


@pytest.mark.parametrize(
    ("variable", "value", "tracker"),
    [
        ("MLFLOW_TRACKING_URI", "sqlite:///{blocker}/mlflow.db", "mlflow"),
        ("MLFLOW_TRACKING_URI", "file://{blocker}/store", "mlflow"),
        ("TRACKIO_DIR", "{blocker}/trackio", "trackio"),
    ],  # fmt: skip
)
def test_a_tracker_store_that_cannot_be_written_is_refused_before_the_model_loads(
    tmp_path: Path, monkeypatch, capsys, variable: str, value: str, tracker: str
) -> None:
    blocker = tmp_path / "a-file"  # a file where the store's folder would be
    blocker.write_text("x\n")
    monkeypatch.setenv(variable, value.format(blocker=blocker))
    out = tmp_path / "run"
    assert cli([*ARGS, "--out", str(out), "--report-to", f"tensorboard,{tracker}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"entrogym train: error: --report-to {tracker}: ")
    assert variable in err[0] and f"{str(blocker)!r} is a file, not a folder" in err[0]
    assert not out.exists()  # refused before the run folder was made or the model loaded
