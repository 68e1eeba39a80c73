"""Adapters verifiable anywhere: an adapter folder entrogym writes (a checkpoint's ``adapter/``,
``adapters/vNNNNNN``) carries its own record, ``entrogym_adapter.json``: the size and sha256 of
its files and the base model's name and identity. So a copy shared without its checkpoint is
verified too: ``eval --adapter`` and ``train --init-adapter`` refuse an altered copy in one line,
exit code 2, before any model loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from adapter_cli import EVAL, MODEL, TINY, TRAIN, garble_tensors

from entrogym.commands import eval as eval_command
from entrogym.commands import train as train_command
from entrogym.train.folder.checkpoint import save_checkpoint

RECORD = "entrogym_adapter.json"


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """A checkpoint's adapter copied out of its run, as a user shares it."""
    from entrogym.train.learner.policy import load_policy

    root = tmp_path_factory.mktemp("runs")
    policy = load_policy(MODEL, seed=0)
    save_checkpoint(root / "run", 1, model=policy, optimizer=None, state={}, base_model=MODEL)
    adapter = root / "run" / "checkpoints" / "iter-000001" / "adapter"
    return Path(shutil.copytree(adapter, root / "shared-adapter"))


def test_an_adapter_folder_carries_its_checksums_and_base_model(shared: Path) -> None:
    from entrogym.models import resolve_model
    from entrogym.train.folder.checkpoint_verify import sha256_of

    record = json.loads((shared / RECORD).read_text())
    assert record["base_model"] == MODEL
    config = json.loads((Path(resolve_model(MODEL)) / "config.json").read_text())
    assert record["base_model_identity"]["hidden_size"] == config["hidden_size"]
    weights = shared / "adapter_model.safetensors"
    entry = record["files"]["adapter_model.safetensors"]
    assert entry == {"size": weights.stat().st_size, "sha256": sha256_of(weights)}


def test_a_published_adapter_version_carries_its_record_too(tmp_path: Path) -> None:
    from entrogym.train.learner.policy import load_policy, save_adapter

    folder = save_adapter(load_policy(MODEL, seed=0), tmp_path / "v000001", base_model=MODEL)
    assert json.loads((folder / RECORD).read_text())["base_model"] == MODEL


def test_an_intact_copy_is_accepted(shared: Path, tmp_path: Path) -> None:
    from entrogym.train.folder.adapter_check import verify_adapter

    copy = Path(shutil.copytree(shared, tmp_path / "copy"))
    assert verify_adapter(str(copy), MODEL, option="adapter") == copy.resolve()
    assert verify_adapter(str(copy), MODEL, option="init_adapter",
                          lora=(16, 32, sorted(json.loads((copy / "adapter_config.json")
                                                          .read_text())["target_modules"])))  # fmt: skip


@pytest.mark.parametrize("damage", ["garbled", "truncated", "config"])
def test_an_altered_copy_is_refused_in_one_line(
    shared: Path, damage: str, tmp_path: Path, capsys, no_model_loads
) -> None:
    copy = Path(shutil.copytree(shared, tmp_path / "copy"))
    weights = copy / "adapter_model.safetensors"
    if damage == "garbled":
        garble_tensors(weights)
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:-4])
    else:  # another LoRA alpha: the same tensors would mean another policy
        config = json.loads((copy / "adapter_config.json").read_text())
        config["lora_alpha"] = 64
        (copy / "adapter_config.json").write_text(json.dumps(config))
    # a file that no longer reads as safetensors is named as damaged before the record is read
    said = "is not a safetensors file" if damage == "truncated" else RECORD
    rc = eval_command.cli([*EVAL, *TINY, "--adapter", str(copy)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert said in err[0] and str(copy) in err[0], err
    out = tmp_path / "second"
    rc = train_command.cli([*TRAIN, *TINY, "--out", str(out), "--init-adapter", str(copy)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert said in err[0] and str(copy) in err[0], err
    assert not out.exists()
