"""An adapter is verified wherever it is loaded (``eval --adapter``, ``train --init-adapter``):
a checkpoint's adapter against the sha256 in its ``meta.json``, and its base model against the
run's model by the model's own identity (its ``config.json``), however either side is named.
Every refusal is one line with exit code 2, before any model loads and before a run folder or
its lock exists.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from adapter_cli import EVAL, MODEL, TINY, TRAIN, garble_tensors

from entrogym.commands import eval as eval_command
from entrogym.commands import train as train_command
from entrogym.models import resolve_model
from entrogym.train.folder.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run folder holding checkpoint iter-000001 of the tiny Llama (LoRA rank 16)."""
    from entrogym.train.learner.policy import load_policy

    folder = tmp_path_factory.mktemp("runs") / "first"
    policy = load_policy(MODEL, seed=0)
    save_checkpoint(folder, 1, model=policy, optimizer=None, state={}, base_model=MODEL)
    return folder


def _copy_run(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


def _set_base(adapter: Path, base: str) -> None:
    config_file = adapter / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = base
    config_file.write_text(json.dumps(config))


def _train(argv: list[str], out: Path, capsys) -> tuple[int, list[str]]:
    rc = train_command.cli([*TRAIN, *TINY, "--out", str(out), *argv])
    return rc, capsys.readouterr().err.strip().splitlines()


def _eval(argv: list[str], capsys) -> tuple[int, list[str]]:
    rc = eval_command.cli([*EVAL, *TINY, *argv])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_a_checkpoint_adapter_with_garbled_tensors_is_refused(
    run: Path, tmp_path: Path, capsys, no_model_loads
) -> None:
    bad = _copy_run(run, tmp_path / "bad")
    ckpt = bad / "checkpoints" / "iter-000001"
    garble_tensors(ckpt / "adapter" / "adapter_model.safetensors")
    rc, err = _eval(["--adapter", str(ckpt / "adapter")], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "sha256" in err[0] and str(ckpt) in err[0] and "another checkpoint" in err[0]
    for source in (ckpt / "adapter", ckpt):
        out = tmp_path / f"second-{source.name}"
        rc, err = _train(["--init-adapter", str(source)], out, capsys)
        assert rc == 2 and len(err) == 1, err
        assert "sha256" in err[0] and "init_adapter" in err[0], err
        assert not out.exists()  # no run folder, no lock


@pytest.mark.parametrize("base", ["some-org/other-model-7b", "qwen3-folder", "missing-folder"])
def test_an_adapter_of_another_base_model_is_refused(
    run: Path, base: str, tmp_path: Path, capsys, no_model_loads
) -> None:
    adapter = _copy_run(run / "checkpoints" / "iter-000001" / "adapter", tmp_path / "adapter")
    if base == "qwen3-folder":  # the same layer shapes as the tiny Llama, another model
        base = str(
            shutil.copytree(resolve_model("tiny-random-qwen3"), tmp_path / MODEL)
        )  # named as the run's model
    elif base == "missing-folder":  # a folder on another machine: only its name can tell
        base = "/elsewhere/models/other-model-7b"
    _set_base(adapter, base)
    rc, err = _eval(["--adapter", str(adapter)], capsys)
    assert rc == 2 and len(err) == 1, err
    assert repr(base) in err[0] and MODEL in err[0], err
    out = tmp_path / "second"
    rc, err = _train(["--init-adapter", str(adapter)], out, capsys)
    assert rc == 2 and len(err) == 1, err
    assert repr(base) in err[0] and MODEL in err[0] and "init_adapter" in err[0], err
    assert not out.exists()


def test_an_adapter_of_the_same_model_under_another_name_is_accepted(
    run: Path, tmp_path: Path
) -> None:
    from entrogym.train.folder.adapter_check import verify_adapter

    adapter = _copy_run(run / "checkpoints" / "iter-000001" / "adapter", tmp_path / "adapter")
    for base in (
        str(
            shutil.copytree(resolve_model(MODEL), tmp_path / "my-copy")
        ),  # another folder, same config.json
        "/elsewhere/.cache/entrogym/models/tiny-random-llama",  # another machine's cache
        "some-org/tiny-random-llama",  # the hub id the built-in stands for
    ):
        _set_base(adapter, base)
        assert verify_adapter(str(adapter), MODEL, option="adapter") == adapter.resolve()
    _set_base(adapter, "some-org/tiny-random-llama")
    with pytest.raises(ValueError, match="no config.json on this machine"):
        verify_adapter(str(adapter), "other-org/other-model", option="adapter", served=True)


def test_init_adapter_errors_come_before_the_model_and_the_run_folder(
    run: Path, tmp_path: Path, capsys, no_model_loads
) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not an adapter\n")
    ckpt = run / "checkpoints" / "iter-000001"
    cases = [
        ([str(tmp_path / "nope")], "does not exist"),
        ([str(a_file)], "is a file"),
        ([str(run), "--model", "tiny-random-qwen3"], "trained on base model"),
        ([str(ckpt / "adapter"), "--lora-rank", "8"], "LoRA rank 16"),
    ]
    for i, (extra, message) in enumerate(cases):
        out = tmp_path / f"run-{i}"
        rc, err = _train(["--init-adapter", *extra], out, capsys)
        assert rc == 2 and len(err) == 1, err
        assert message in err[0], err
        assert not out.exists(), extra


def test_a_rank_mismatch_is_one_line_saying_what_to_do(run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "second"
    rc, err = _train(["--init-adapter", str(run), "--lora-rank", "8"], out, capsys)
    assert rc == 2 and len(err) == 1, err
    assert "LoRA rank 16" in err[0] and "--lora-rank 8" in err[0], err
    assert "pass --lora-rank 16" in err[0], err


def _cache_hub_model(cache: Path, repo_id: str, folder: str) -> None:
    """``folder``'s config.json as hub model ``repo_id`` in a Hugging Face cache at ``cache``."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    shutil.copy(Path(folder) / "config.json", snapshot / "config.json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)


def test_a_hub_id_in_the_local_cache_is_compared_by_its_config(
    run: Path, tmp_path: Path, monkeypatch
) -> None:
    import huggingface_hub.constants

    from entrogym.train.folder.adapter_check import verify_adapter

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _cache_hub_model(tmp_path / "hub", "some-org/llama-twin", resolve_model(MODEL))
    _cache_hub_model(
        tmp_path / "hub", "some-org/tiny-random-llama", resolve_model("tiny-random-qwen3")
    )
    adapter = _copy_run(run / "checkpoints" / "iter-000001" / "adapter", tmp_path / "adapter")
    _set_base(adapter, "some-org/llama-twin")  # another name, the same config.json
    assert verify_adapter(str(adapter), MODEL, option="adapter") == adapter.resolve()
    _set_base(adapter, "some-org/tiny-random-llama")  # the model's name, another config.json
    with pytest.raises(ValueError, match="config.json differ: model_type 'qwen3' vs 'llama'"):
        verify_adapter(str(adapter), MODEL, option="adapter")


def test_a_name_without_a_config_never_builds_the_other_model(tmp_path: Path, monkeypatch) -> None:
    from entrogym.train.folder.model_identity import base_model_mismatch

    monkeypatch.setenv("ENTROGYM_CACHE", str(tmp_path / "cache"))
    mismatch = base_model_mismatch("some-org/other-model-7b", "smollm2-135m-instruct")
    assert mismatch is not None and not mismatch.certain
    assert "'some-org/other-model-7b' has no config.json" in mismatch.why
    assert not (tmp_path / "cache").exists()  # nothing was built to compare with
    assert base_model_mismatch("/elsewhere/smollm2-135m-instruct", "smollm2-135m-instruct") is None
