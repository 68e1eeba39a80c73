"""A full disk while writing a checkpoint is reported as one; the previous checkpoint stays."""

from __future__ import annotations

import errno

import pytest
import torch

from entrogym.train.folder.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint


def _save(run, it: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(run, it, model=model, optimizer=opt, state={"it": it}, base_model="toy")
    return model


def _torch_zip_short_write(obj, f, *args, **kwargs):
    # What torch.save raises when the disk fills up mid-write (PyTorchStreamWriter).
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1664 vs 1558")


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("failure", ["torch_zip", "enospc_weights"])
def test_full_disk_is_named_and_the_previous_checkpoint_survives(tmp_path, monkeypatch, failure):
    first = _save(tmp_path, 1, seed=0)
    if failure == "torch_zip":
        monkeypatch.setattr(torch, "save", _torch_zip_short_write)
    else:
        import safetensors.torch

        monkeypatch.setattr(safetensors.torch, "save_file", _enospc)
    with pytest.raises(OSError) as info:
        _save(tmp_path, 2, seed=1)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    message = str(info.value)
    assert "No space left on device while writing checkpoint iter-000002" in message
    assert "intact" in message and "--resume" in message
    cdir = tmp_path / "checkpoints"
    assert sorted(p.name for p in cdir.iterdir()) == ["iter-000001", "latest"]
    assert latest_checkpoint(tmp_path) == cdir / "iter-000001"
    restored = torch.nn.Linear(4, 2)
    assert load_checkpoint(tmp_path, model=restored)["iteration"] == 1
    assert torch.equal(restored.weight, first.weight)


def test_other_errors_are_not_called_a_full_disk(tmp_path, monkeypatch):
    _save(tmp_path, 1, seed=0)

    def broken(*args, **kwargs):
        raise RuntimeError("something else")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(RuntimeError, match="something else"):
        _save(tmp_path, 2, seed=1)
