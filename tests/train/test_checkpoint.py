"""Atomic checkpoints: round trip, bad input, faults mid-save, kill -9 and resume."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import random
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
from tiny_llama import tiny_llama_config

from entrogym.train.folder import checkpoint as ckpt
from entrogym.train.folder.checkpoint import (
    CheckpointWarning,
    best_checkpoint,
    latest_checkpoint,
    load_adapter_into,
    load_checkpoint,
    mark_best,
    resolve_adapter,
    save_checkpoint,
)
from entrogym.train.folder.metrics import read_metrics

BASE = "tiny-llama-test"


def _tiny_base():
    """A tiny random LlamaForCausalLM, the same weights every call."""
    from transformers import LlamaForCausalLM

    config = tiny_llama_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(config)


def _tiny_peft(rank: int = 4):
    """A real peft LoRA (random A, B = 0) on :func:`_tiny_base`."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"])
    return get_peft_model(_tiny_base(), lora)


def _train_step(model, optimizer, seed: int = 1) -> None:
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(seed))
    loss = model(input_ids=ids, labels=ids).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _lora_params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _draws() -> tuple:
    return (torch.rand(3).tolist(), random.random(), np.random.rand(2).tolist())


@pytest.fixture(scope="module")
def peft_run(tmp_path_factory):
    """A run folder with one checkpoint of a trained peft model, and what it holds."""
    run = tmp_path_factory.mktemp("run")
    model = _tiny_peft()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for seed in (1, 2):
        _train_step(model, opt, seed)
    state = {"zeta": 0.002, "target_entropy": 0.31, "metrics_rows": 7}
    path = save_checkpoint(run, 2, model=model, optimizer=opt, state=state, base_model=BASE)
    expected_draws = _draws()  # the numbers a resumed run must draw next
    saved = _lora_params(model)
    return run, path, model, opt, state, expected_draws, saved


def test_round_trip_restores_adapter_optimizer_and_rng(peft_run):
    run, path, trained, trained_opt, state, expected_draws, _ = peft_run
    assert path == run / "checkpoints" / "iter-000002"
    assert (path / "adapter" / "adapter_config.json").is_file()
    assert (path / "adapter" / "adapter_model.safetensors").is_file()
    meta = json.loads((path / "meta.json").read_text())
    assert meta["iteration"] == 2 and meta["base_model"] == BASE and meta["completed"] is True
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter-000002"

    _draws()  # move every RNG on; the load must put them back
    fresh = _tiny_peft()
    opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=1e-2)
    assert any(
        not torch.equal(fresh_p, trained_p)
        for fresh_p, trained_p in zip(
            _lora_params(fresh).values(), _lora_params(trained).values(), strict=True
        )
    )
    got = load_checkpoint(path, model=fresh, optimizer=opt, base_model=BASE)
    assert got == {**state, "iteration": 2}
    assert _draws() == expected_draws
    for (name, a), b in zip(
        _lora_params(fresh).items(), _lora_params(trained).values(), strict=True
    ):
        assert torch.equal(a, b), name
    # The same step from both: equal results only if the Adam moments were restored too.
    _train_step(fresh, opt, seed=3)
    _train_step(trained, trained_opt, seed=3)
    for a, b in zip(_lora_params(fresh).values(), _lora_params(trained).values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_checkpoint_from_another_base_model_is_refused(peft_run):
    run, path, *_ = peft_run
    model = _tiny_peft()
    with pytest.raises(ValueError, match=f"{BASE}.*smollm2-135m-instruct"):
        load_checkpoint(path, model=model, base_model="smollm2-135m-instruct")
    with pytest.raises(ValueError, match=f"{BASE}.*smollm2-135m-instruct"):
        load_adapter_into(model, run, base_model="smollm2-135m-instruct")


def test_init_adapter_sources(peft_run, tmp_path):
    run, path, trained, *_, want = peft_run
    plain = tmp_path / "plain-adapter"
    load_adapter_into(trained, path)  # other tests train it further; back to the saved weights
    trained.save_pretrained(str(plain))
    for source, folder in [(run, path / "adapter"), (path, path / "adapter"), (plain, plain)]:
        model = _tiny_peft()
        assert load_adapter_into(model, source, base_model=BASE) == folder
        for a, b in zip(_lora_params(model).values(), want.values(), strict=True):
            assert torch.equal(a, b)
    # The adapter folder is plain peft format: PeftModel.from_pretrained reads it as is.
    from peft import PeftModel

    loaded = PeftModel.from_pretrained(_tiny_base(), str(resolve_adapter(run)), is_trainable=True)
    for a, b in zip(_lora_params(loaded).values(), want.values(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="does not exist"):
        resolve_adapter(tmp_path / "nope")
    with pytest.raises(ValueError, match="neither"):
        resolve_adapter(tmp_path)
    with pytest.raises(ValueError, match="does not fit|does not match") as refused:
        load_adapter_into(_tiny_peft(rank=2), path)
    assert "\n" not in str(refused.value)  # one line, not one per tensor


def _linear(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 2)


def _save_linear(run, it, model, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return save_checkpoint(
        run, it, model=model, optimizer=opt, state={"it": it}, base_model="toy", **kw
    )


@pytest.mark.parametrize("where", ["weights", "trainer_state", "rename", "resave"])
def test_failure_mid_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, where):
    first = _linear(0)
    good = _save_linear(tmp_path, 1, first)
    latest_before = (tmp_path / "checkpoints" / "latest").read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def partial_then_full(obj, f, *a, **k):
        with open(f, "wb") as fh:
            fh.write(b"PK\x03\x04 half a file")
        disk_full()

    if where == "weights":
        import safetensors.torch

        monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    elif where == "trainer_state":
        monkeypatch.setattr(torch, "save", partial_then_full)
    else:  # the rename of the finished folder into place fails
        real_replace = os.replace

        def replace(src, dst):
            if str(src).endswith(f".tmp-{os.getpid()}") and "iter-" in str(src):
                disk_full()
            real_replace(src, dst)

        monkeypatch.setattr(ckpt.os, "replace", replace)
    again = 1 if where == "resave" else 2  # resave: the same iteration, swapped in place
    with pytest.raises(OSError, match="No space") as info:
        _save_linear(tmp_path, again, _linear(1))
    assert any(f"iter-00000{again} was not written" in n for n in info.value.__notes__)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["iter-000001", "latest"]
    assert (tmp_path / "checkpoints" / "latest").read_bytes() == latest_before
    assert latest_checkpoint(tmp_path) == good
    restored = _linear(5)
    assert load_checkpoint(tmp_path, model=restored)["iteration"] == 1
    assert torch.equal(restored.weight, first.weight)


def test_corrupt_or_partial_folders_are_skipped_with_a_warning(tmp_path):
    for it in (1, 2, 3):
        _save_linear(tmp_path, it, _linear(it), keep=5)
    cdir = tmp_path / "checkpoints"
    # A killed save of iteration 4 (its process is gone) left its temporary folder behind.
    (cdir / "iter-000004.tmp-999999999").mkdir()
    state_file = cdir / "iter-000003" / "trainer_state.pt"
    state_file.write_bytes(state_file.read_bytes()[:-10])
    with pytest.warns(CheckpointWarning, match="iter-000003.*truncated"):
        assert latest_checkpoint(tmp_path) == cdir / "iter-000002"
    assert not (cdir / "iter-000004.tmp-999999999").exists()
    (cdir / "iter-000002" / "meta.json").unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert latest_checkpoint(tmp_path) == cdir / "iter-000001"
    messages = sorted(str(w.message) for w in caught if w.category is CheckpointWarning)
    assert len(messages) == 2
    assert "iter-000002: meta.json missing" in messages[0] and "iter-000003" in messages[1]
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        load_checkpoint(cdir / "iter-000002", model=_linear(0))


def test_keep_last_checkpoints_plus_best(tmp_path):
    for it in range(1, 7):
        _save_linear(tmp_path, it, _linear(it), keep=2, best=(it == 2))
    cdir = tmp_path / "checkpoints"
    assert sorted(p.name for p in cdir.glob("iter-*")) == [
        "iter-000002",
        "iter-000005",
        "iter-000006",
    ]
    assert best_checkpoint(tmp_path) == cdir / "iter-000002"
    mark_best(tmp_path, 6, keep=2)
    assert sorted(p.name for p in cdir.glob("iter-*")) == ["iter-000005", "iter-000006"]
    with pytest.raises(ValueError, match="iter-000003"):
        mark_best(tmp_path, 3)
    _save_linear(tmp_path, 6, _linear(9), keep=2)  # the same iteration again: the newer wins
    restored = _linear(0)
    load_checkpoint(cdir / "iter-000006", model=restored)
    assert torch.equal(restored.weight, _linear(9).weight)


# A toy training loop that uses only the global RNGs, checkpoints every 3 iterations and at the
# end, and resumes from its latest checkpoint. KILL_AT=n sends itself SIGKILL just before the
# n-th os.replace: the 1st/2nd of each save rename the folder / update `latest`.
TOY = textwrap.dedent(
    """
    import os, random, signal, sys
    import numpy as np, torch
    from entrogym.train.folder.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from entrogym.train.folder.metrics import MetricsLogger

    def main(run_dir, iterations, kill_at=0):
        if kill_at:
            real, calls = os.replace, [0]
            def replace(src, dst):
                calls[0] += 1
                if calls[0] == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                real(src, dst)
            os.replace = replace
        torch.manual_seed(0); random.seed(0); np.random.seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        start, rows = 0, None
        found = latest_checkpoint(run_dir)
        if found is not None:
            st = load_checkpoint(found, model=model, optimizer=opt, base_model="toy")
            start, rows = st["iteration"], st["metrics_rows"]
        log = MetricsLogger(run_dir, resume_rows=rows, tensorboard=False)
        for it in range(start + 1, iterations + 1):
            x = torch.randn(8, 4) + random.random() + float(np.random.rand())
            loss = ((model(x) - 1.0) ** 2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            log.log({"iteration": it, "loss": loss.item(), "w": model.weight.sum().item()}, it)
            if it % 3 == 0 or it == iterations:
                save_checkpoint(run_dir, it, model=model, optimizer=opt,
                                state={"metrics_rows": log.rows}, base_model="toy")
        log.close()

    if __name__ == "__main__":
        main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    """
)


def test_kill_9_then_resume_matches_an_uninterrupted_run(tmp_path):
    script = tmp_path / "toy.py"
    script.write_text(TOY)
    spec = importlib.util.spec_from_file_location("toy", script)
    toy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toy)
    toy.main(str(tmp_path / "reference"), 7)
    reference = read_metrics(tmp_path / "reference")
    assert [r["iteration"] for r in reference] == list(range(1, 8))

    run = tmp_path / "killed"

    def killed_run(kill_at: int) -> None:
        done = subprocess.run([sys.executable, script, run, "7", str(kill_at)], capture_output=True)
        assert done.returncode == -9, done.stderr.decode()[-2000:]

    # Killed inside the save of iteration 6, before its folder was renamed into place:
    # rows 4-6 are on disk but the newest checkpoint is iteration 3.
    killed_run(kill_at=3)
    assert len(read_metrics(run)) == 6
    assert latest_checkpoint(run).name == "iter-000003"
    # Resumed, then killed after iteration 6's folder was renamed but before `latest` was updated.
    killed_run(kill_at=2)
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter-000003"
    assert latest_checkpoint(run).name == "iter-000006"
    toy.main(str(run), 7)  # resumed to the end (in this process: no third interpreter start)
    assert read_metrics(run) == reference  # no row lost or duplicated, the same numbers
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted(
        p.name for p in (tmp_path / "reference" / "checkpoints").iterdir()
    )
