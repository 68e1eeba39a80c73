"""A corrupted newest checkpoint (right size, wrong bytes) falls back to the newest intact one."""

from __future__ import annotations

import json
import os

import pytest
import torch
import vowel_env  # registers test/Vowel-v0; TINY_RUN

from entrogym.train.config import TrainConfig
from entrogym.train.folder.checkpoint import (
    CheckpointWarning,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.trainer import train

TINY = {**vowel_env.TINY_RUN, "checkpoint_every": 1}


def _linear_run(run, iterations=(1, 2)) -> None:
    for it in iterations:
        torch.manual_seed(it)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        save_checkpoint(run, it, model=model, optimizer=opt, state={"it": it}, base_model="toy")


def _scramble(path, zero: bool = False) -> None:
    size = path.stat().st_size
    path.write_bytes(bytes(size) if zero else os.urandom(size))


@pytest.mark.parametrize("damage", ["random_state", "zeroed_weights"])
def test_damaged_newest_checkpoint_falls_back_with_a_warning(tmp_path, damage):
    _linear_run(tmp_path)
    newest = tmp_path / "checkpoints" / "iter-000002"
    target = "trainer_state.pt" if damage == "random_state" else "adapter/model.safetensors"
    _scramble(newest / target, zero=damage == "zeroed_weights")
    with pytest.warns(CheckpointWarning, match=f"iter-000002: {target} does not match its sha256"):
        assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "iter-000001"
    with pytest.warns(CheckpointWarning):
        assert load_checkpoint(tmp_path, model=torch.nn.Linear(4, 2))["iteration"] == 1
    with pytest.raises(ValueError, match="sha256"):
        load_checkpoint(newest, model=torch.nn.Linear(4, 2))


def test_meta_records_size_and_sha256_and_old_size_only_meta_still_loads(tmp_path):
    _linear_run(tmp_path, iterations=(1,))
    path = tmp_path / "checkpoints" / "iter-000001"
    meta = json.loads((path / "meta.json").read_text())
    entry = meta["files"]["trainer_state.pt"]
    assert entry["size"] == (path / "trainer_state.pt").stat().st_size
    assert len(entry["sha256"]) == 64
    # A checkpoint written before checksums existed lists sizes only: checked by size.
    meta["files"] = {rel: e["size"] for rel, e in meta["files"].items()}
    (path / "meta.json").write_text(json.dumps(meta))
    assert load_checkpoint(path, model=torch.nn.Linear(4, 2))["iteration"] == 1


def test_trainer_resumes_from_the_newest_intact_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    train(TrainConfig(out=str(run), iterations=2, **TINY))
    assert sorted(p.name for p in (run / "adapters").iterdir()) == ["v000001", "v000002"]
    newest = run / "checkpoints" / "iter-000001"
    _scramble(newest / "adapter" / "adapter_model.safetensors", zero=True)
    with pytest.warns(CheckpointWarning, match="iter-000001.*sha256"):
        train(TrainConfig(out=str(run), iterations=3, resume=True, **TINY))
    assert "resuming" in capsys.readouterr().out
    rows = read_metrics(run)
    assert [r["iteration"] for r in rows] == [0, 1, 2]  # iteration 1 trained again, once
    assert latest_checkpoint(run).name == "iter-000002"
    history = (run / "config_history.jsonl").read_text().splitlines()
    assert [json.loads(h)["event"] for h in history] == ["start", "resume"]
    assert json.loads(history[1])["from_iteration"] == 1
    # A checkpoint from before checksums (sizes only) with random bytes: the load fails and
    # the trainer falls back to the one before.
    newest = run / "checkpoints" / "iter-000002"
    meta = json.loads((newest / "meta.json").read_text())
    meta["files"] = {rel: e["size"] for rel, e in meta["files"].items()}
    (newest / "meta.json").write_text(json.dumps(meta))
    _scramble(newest / "trainer_state.pt")
    with pytest.warns(CheckpointWarning, match="ignoring checkpoint .*iter-000002"):
        train(TrainConfig(out=str(run), iterations=4, resume=True, **TINY))
    assert "after iteration 1" in capsys.readouterr().out
    assert [r["iteration"] for r in read_metrics(run)] == [0, 1, 2, 3]
