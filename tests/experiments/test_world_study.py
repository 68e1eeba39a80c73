"""``benchmarks/studies/world_presets.py``: a stopped study goes on where it stopped: a finished
run is not run again, a stopped training run resumes from its newest checkpoint (``entrogym
train --resume``, exact by the trainer's own tests), and a run without one starts afresh."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "studies"))

import world_presets  # noqa: E402


@pytest.fixture
def commands(monkeypatch):
    """The commands the study would run, in order, with the log each would write to."""
    ran: list[tuple[list[str], Path, bool]] = []

    def fake(command: list[str], log: Path, *, append: bool = False) -> None:
        ran.append((command, log, append))

    monkeypatch.setattr(world_presets, "_logged", fake)
    return ran


def _checkpoint(folder: Path, name: str) -> None:
    (folder / "checkpoints" / name / "adapter").mkdir(parents=True)


def test_a_stopped_run_resumes_from_its_checkpoint_and_keeps_its_log(tmp_path, commands):
    folder = tmp_path / "grpo-s3"
    _checkpoint(folder, "iter-000009")
    (folder / "metrics.jsonl").write_text('{"iteration": 9}\n')
    world_presets.run_one("grpo", 3, tmp_path)
    (train, log, append), (challenge, _, _) = commands
    assert train[train.index("--out") + 1] == str(folder) and "--resume" in train
    assert append and log == tmp_path / "grpo-s3.train.log"
    assert (folder / "metrics.jsonl").read_text() == '{"iteration": 9}\n'  # nothing cleared
    assert challenge[challenge.index("--split") + 1] == "test_challenge"


def test_a_run_without_a_checkpoint_starts_afresh(tmp_path, commands):
    folder = tmp_path / "held-s3"
    (folder / "checkpoints" / ".tmp-123").mkdir(parents=True)  # a killed save is no checkpoint
    (folder / "metrics.jsonl").write_text('{"iteration": 0}\n')
    world_presets.run_one("held", 3, tmp_path)
    (train, _, append), _ = commands
    assert "--resume" not in train and not append
    assert not (folder / "metrics.jsonl").exists()  # the half-written folder was cleared


def test_a_trained_run_is_only_evaluated_and_a_finished_one_is_left_alone(tmp_path, commands):
    trained = tmp_path / "dapo-s3"
    _checkpoint(trained, "iter-000019")
    world_presets.run_one("dapo", 3, tmp_path)
    assert [c[0][3] for c in commands] == ["eval"]
    (trained / "challenge").mkdir()
    (trained / "challenge" / "eval.json").write_text("{}")
    world_presets.run_one("dapo", 3, tmp_path)
    assert len(commands) == 1
