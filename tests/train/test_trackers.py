"""``--report-to``: the real wandb (offline), trackio and mlflow packages get the metrics rows of
``metrics.jsonl`` (same names and steps, eval rows under ``eval/``) and the run's config; a
tracker failing mid-run is reported once and the run goes on."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from tracker_records import expected, same, wandb_history
from vowel_env import TINY_SETTINGS

from entrogym.algos import get_algorithm
from entrogym.commands.train import cli, parse_config
from entrogym.train.config import TrainConfig
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.folder.trackers import mlflow_name, parse_report_to
from entrogym.train.trainer import train

TESTS = Path(__file__).resolve().parents[1]
ARGS = ["--env", "vowel_env:test/Vowel-v0", "--model", "tiny-random-llama", "--engine", "hf",
        "--engine-dtype", "fp32", "--iterations", "2", "--tasks-per-iter", "2", "--samples", "2",
        "--early-stop-min-per-task", "2", "--max-response-tokens", "4",
        "--max-context-tokens", "128", "--threads", "1", "--eval-env", "vowel_env:test/Vowel-v0",
        "--eval-split", "train", "--eval-every", "1", "--eval-tasks", "2"]  # fmt: skip


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory) -> tuple[Path, Path, str]:
    """One real run with all four trackers, offline, in its own process (as a user runs it)."""
    tmp = tmp_path_factory.mktemp("trackers")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    env |= {"PYTHONPATH": str(TESTS), "TRACKIO_DIR": str(tmp / "trackio"), "HF_HUB_OFFLINE": "1"}
    argv = [*ARGS, "--out", str(tmp / "run"), "--report-to", "tensorboard,wandb,trackio,mlflow"]
    done = subprocess.run([sys.executable, "-m", "entrogym", "train", *argv], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "run", tmp / "trackio", done.stderr


def test_every_tracker_gets_metrics_jsonls_rows(tracked_run) -> None:
    from mlflow.tracking import MlflowClient

    run_dir, trackio_dir, stderr = tracked_run
    want = expected(read_metrics(run_dir))
    assert sorted(want) == [0, 1] and "eval/pass@1" in want[0] and "entropy" in want[1]
    # wandb: offline (no API key), said once, history = metrics.jsonl
    assert stderr.count("wandb runs offline") == 1
    assert same(wandb_history(run_dir), want)
    # trackio: its local store (TRACKIO_DIR), project entrogym, run named after the folder
    db = sqlite3.connect(trackio_dir / "entrogym.db")
    logged: dict[int, dict[str, float]] = {}
    for step, metrics in db.execute("select step, metrics from metrics where run_name='run'"):
        logged.setdefault(step, {}).update(json.loads(metrics))
    assert same(logged, want)
    (config,) = db.execute("select config from configs").fetchone()
    assert json.loads(config)["env"] == "vowel_env:test/Vowel-v0"
    # mlflow: RUN/mlflow.db, pass@1 named pass_at_1 (MLflow refuses '@')
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("entrogym").experiment_id])
    assert run.data.params["report_to"] == "tensorboard,wandb,trackio,mlflow"
    for step, scalars in want.items():
        for name, value in scalars.items():
            history = client.get_metric_history(run.info.run_id, mlflow_name(name))
            assert [m.value for m in history if m.step == step] == [pytest.approx(value)], name
    assert (run_dir / "tb").is_dir()


def test_a_tracker_failing_mid_run_is_reported_once_and_the_run_goes_on(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import trackio.run

    calls = {"n": 0}
    real_log = trackio.run.Run.log

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] >= 2:
            raise ConnectionError("trackio server went away")
        return real_log(self, *args, **kwargs)

    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setattr(trackio.run.Run, "log", flaky)
    cfg = TrainConfig(**TINY_SETTINGS | dict(iterations=3), env="test/Vowel-v0", algo=get_algorithm("grpo"),
                      report_to="trackio", out=str(tmp_path / "run"))  # fmt: skip
    rows = read_metrics(train(cfg))
    assert [r["iteration"] for r in rows] == [0, 1, 2]  # the run went on; metrics.jsonl whole
    err = capsys.readouterr().err
    assert err.count("--report-to trackio failed") == 1 and "trackio server went away" in err
    assert calls["n"] == 2  # switched off after its failure: not called again
    assert not (tmp_path / "run" / "tb").exists()  # tensorboard was not asked for


def test_report_to_values() -> None:
    assert parse_report_to("tensorboard,WandB, mlflow") == ["tensorboard", "wandb", "mlflow"]
    assert parse_report_to("none") == [] and parse_report_to(["trackio"]) == ["trackio"]
    assert parse_config(["--report-to", "wandb,trackio"]).report_to == "wandb,trackio"
    assert TrainConfig().report_to == "tensorboard"
    assert mlflow_name("eval/pass@4") == "eval/pass_at_4"


def test_bad_trackers_exit_2_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    assert cli(["--report-to", "tensorboard,comet", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "comet" in err[0] and "tensorboard, wandb, trackio, mlflow" in err[0]
    import entrogym.extras as extras

    real = extras.importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))  # fmt: skip
    assert cli([*ARGS[:2], "--report-to", "wandb", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'pip install -e ".[wandb]"' in err[0]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
