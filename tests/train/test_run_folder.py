"""Run folders: foreign folders refused untouched, the resume config check, config history,
"nothing to do", and adapter pruning. No model loads: every refusal comes before one."""

from __future__ import annotations

import json

import pytest
import torch
import vowel_env  # registers test/Vowel-v0; TINY_RUN
import yaml

from entrogym.algos import algorithm_mapping, get_algorithm
from entrogym.train.config import TrainConfig
from entrogym.train.folder import safety as run_folder
from entrogym.train.folder.checkpoint import save_checkpoint
from entrogym.train.folder.layout import is_entrogym_run
from entrogym.train.folder.safety import (
    RunFolderError,
    config_differences,
    open_run_folder,
    prune_adapters,
    saved_algorithm,
)
from entrogym.train.learner import update as learner_module
from entrogym.train.trainer import train

SMALL = vowel_env.TINY_RUN


def _snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def no_model_loads(monkeypatch):
    """Every test here must finish before a model loads: fail loudly if one would."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the run folder was checked")

    monkeypatch.setattr(learner_module, "load_policy", refuse)


def _finished_run(tmp_path, iterations: int = 12, **overrides) -> TrainConfig:
    """A run folder as a finished ``iterations``-iteration run leaves it (cheap: the
    checkpoint holds a toy module; only its meta is read before the refusals under test)."""
    cfg = TrainConfig(out=str(tmp_path / "run"), iterations=iterations, **{**SMALL, **overrides})
    folder = open_run_folder(cfg.out, cfg.to_dict(), resume=False)
    folder.record("start", cfg.to_dict(), from_iteration=0)
    folder.release()
    model = torch.nn.Linear(2, 1)
    save_checkpoint(cfg.out, iterations - 1, model=model, optimizer=None, state={}, base_model="x")
    return cfg


def test_resume_of_a_foreign_folder_is_refused_and_nothing_is_touched(tmp_path, no_model_loads):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "metrics.jsonl").write_text('{"loss": 1}\n{"loss": 2}\n')
    before = _snapshot(folder)
    cfg = TrainConfig(out=str(folder), resume=True, **SMALL)
    with pytest.raises(RunFolderError, match="not an entrogym run.*notes.txt"):
        train(cfg)
    assert _snapshot(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl", "notes.txt"]
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(RunFolderError, match="is a file"):
        train(TrainConfig(out=str(file), **SMALL))


def test_runs_are_recognised_by_marker_or_old_layout(tmp_path):
    cfg = TrainConfig(out=str(tmp_path / "new"), **SMALL)
    open_run_folder(cfg.out, cfg.to_dict(), resume=False).release()
    marker = json.loads((tmp_path / "new" / "entrogym-run.json").read_text())
    assert marker["format"] == 1 and "created" in marker
    assert is_entrogym_run(tmp_path / "new")
    old = tmp_path / "old"  # written before the marker existed
    (old / "checkpoints").mkdir(parents=True)
    (old / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    assert is_entrogym_run(old)
    (old / "checkpoints").rmdir()
    assert not is_entrogym_run(old)  # a config.yaml alone could be anyone's


def test_algorithms_compare_by_what_they_resolve_to():
    # the knobs given and the whole mapping they resolve to read as the same algorithm
    new = {"algo": {"name": "repo-r", "controller": {"max": 0.5}, "lever": {"centering": "exact"}}}
    whole = {"algo": algorithm_mapping(saved_algorithm(new))}
    assert whole["algo"]["controller"]["max"] == 0.5
    assert saved_algorithm(whole) == saved_algorithm(new)
    assert config_differences(whole, new) == {}
    assert config_differences({"algo": "grpo"}, {"algo": {"name": "grpo"}}) == {}
    other = config_differences(new, {"algo": {"name": "repo-r", "controller": {"max": 0.25}}})
    assert other["algo"][0] == {
        "controller": [new_controller(0.5), new_controller(0.25)],
        "lever": [{"name": "repo-r", "centering": "exact"}, {"name": "repo-r", "centering": "raw"}],
    }
    # a changed controller or lever is a changed algorithm: a resume refuses it
    swapped = config_differences(new, {"algo": {**new["algo"], "controller": {"name": "pi"}}})
    assert set(swapped["algo"][0]) == {"controller"}


def new_controller(max_: float) -> dict:
    return {"name": "paper", "target": 1.0, "target_unit": "ratio", "target_iterations": 1,
            "target_probe": 0, "estimator": "exact",
            "step": "iteration", "init": None, "min": None, "max": max_,
            "factor": 2.0}  # fmt: skip


def test_engine_may_move_but_not_change_its_sampler():
    from entrogym.train.folder.safety import refused_changes

    moved = config_differences(
        {"algo": "grpo", "engine": "vllm"}, {"algo": "grpo", "engine": "vllm-server"}
    )
    assert moved and refused_changes(moved) == {}
    other = config_differences({"algo": "grpo", "engine": "vllm"}, {"algo": "grpo", "engine": "hf"})
    assert refused_changes(other) == {"engine": ["vllm", "hf"]}


def test_resuming_a_sequential_run_does_not_count_init_adapter_as_a_change():
    saved = {"algo": "grpo", "init_adapter": "runs/first", "lr": 5e-5}
    assert config_differences(saved, {"algo": "grpo", "init_adapter": None, "lr": 5e-5}) == {}
    other = config_differences(saved, {"algo": "grpo", "init_adapter": "runs/other", "lr": 5e-5})
    assert other == {"init_adapter": ["runs/first", "runs/other"]}


def test_resume_with_another_experiment_is_refused_listing_the_differences(
    tmp_path, no_model_loads
):
    cfg = _finished_run(tmp_path, iterations=3)
    before = _snapshot(tmp_path / "run")
    changed = TrainConfig(
        out=cfg.out,
        resume=True,
        iterations=6,
        **{**SMALL, "algo": get_algorithm("grpo"), "lr": 0.5},
    )
    with pytest.raises(RunFolderError, match="change the experiment") as info:
        train(changed)
    message = str(info.value)
    assert "lr: 5e-05 -> 0.5" in message
    assert "'repo-r' -> 'grpo'" in message
    assert "  iterations:" not in message  # extending a run is allowed
    after = _snapshot(tmp_path / "run")
    after.pop(".lock")  # the lock file holds the pid of the last process that took it
    before.pop(".lock")
    assert after == before


def test_finished_run_resumed_with_fewer_iterations_has_nothing_to_do(
    tmp_path, no_model_loads, capsys
):
    cfg = _finished_run(tmp_path, iterations=12)
    run = tmp_path / "run"
    config_before = (run / "config.yaml").read_bytes()
    history_before = (run / "config_history.jsonl").read_bytes()
    out = train(TrainConfig(out=cfg.out, resume=True, iterations=5, **SMALL))
    assert out == run
    assert "nothing to do" in capsys.readouterr().out
    assert (run / "config.yaml").read_bytes() == config_before
    assert (run / "config_history.jsonl").read_bytes() == history_before
    assert not (run / "metrics.jsonl").exists()


def test_allowed_changes_are_recorded_in_the_history(tmp_path):
    cfg = _finished_run(tmp_path, iterations=3)
    run = tmp_path / "run"
    more = TrainConfig(out=cfg.out, resume=True, iterations=8, eval_every=2, **SMALL)
    folder = open_run_folder(run, more.to_dict(), resume=True)
    folder.record("resume", more.to_dict(), from_iteration=3)
    folder.release()
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert [h["event"] for h in history] == ["start", "resume"]
    assert history[0]["config"]["iterations"] == 3
    assert history[1]["changed"] == {"eval_every": [0, 2], "iterations": [3, 8]}
    assert yaml.safe_load((run / "config.yaml").read_text())["iterations"] == 8
    # The same config again: a history line, but config.yaml is not rewritten.
    mtime = (run / "config.yaml").stat().st_mtime_ns
    folder = open_run_folder(run, more.to_dict(), resume=True)
    folder.record("resume", more.to_dict(), from_iteration=5)
    folder.release()
    assert (run / "config.yaml").stat().st_mtime_ns == mtime
    assert len((run / "config_history.jsonl").read_text().splitlines()) == 3


def test_fresh_run_into_a_used_folder_is_refused(tmp_path, no_model_loads):
    cfg = _finished_run(tmp_path, iterations=3)
    with pytest.raises(RunFolderError, match="--resume"):
        train(TrainConfig(out=cfg.out, iterations=3, **SMALL))


def test_adapter_folders_stay_bounded(tmp_path):
    root = tmp_path / "adapters"
    for version in range(50):  # what publish_adapter does once per iteration
        (run_folder.adapter_folder(tmp_path, version) / "w").parent.mkdir(parents=True)
        (run_folder.adapter_folder(tmp_path, version) / "w").write_bytes(b"0" * 100)
        prune_adapters(tmp_path, version)
        assert len(list(root.iterdir())) <= 2
    assert sorted(p.name for p in root.iterdir()) == ["v000048", "v000049"]
    # A resumed run re-publishes an earlier version: the killed run's later ones go.
    assert prune_adapters(tmp_path, 48) == [root / "v000049"]
    assert sorted(p.name for p in root.iterdir()) == ["v000048"]
    with pytest.raises(ValueError, match="keep"):
        prune_adapters(tmp_path, 3, keep=0)


def test_unreadable_config_yaml_is_refused_not_overwritten(tmp_path, no_model_loads):
    cfg = _finished_run(tmp_path, iterations=3)
    config = tmp_path / "run" / "config.yaml"
    config.write_text("env: [unclosed\n")
    with pytest.raises(RunFolderError, match="config.yaml is unreadable"):
        train(TrainConfig(out=cfg.out, resume=True, iterations=6, **SMALL))
    assert config.read_text() == "env: [unclosed\n"
