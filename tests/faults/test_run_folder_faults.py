"""A damaged run folder says what is wrong in one line, through the real ``entrogym train``: a
run file turned into a folder before ``--resume``, a run folder that breaks while an adapter
is published (with TensorBoard writing into it), ``--init-adapter`` of a run with no
checkpoint yet, and the leftover ``.tmp-PID`` folder of a killed checkpoint save, which never
counts as a checkpoint. The history names what each start was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import hostile_envs  # noqa: F401  (registers faults/Hostile-v0)
import pytest
from hostile_cli import hostile_args, one_line

from entrogym.commands import train as train_command
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.folder.safety import HISTORY_FILE


def _events(out: Path) -> list[tuple[str, int | None]]:
    history = [json.loads(x) for x in (out / HISTORY_FILE).read_text().splitlines()]
    return [(h["event"], h.get("from_iteration")) for h in history]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A 1-iteration run with its checkpoint iter-000000 (copy it before changing it)."""
    out = tmp_path_factory.mktemp("base") / "run"
    assert train_command.cli(hostile_args(out)) == 0
    assert _events(out) == [("start", 0)]
    return out


@pytest.mark.parametrize(
    ("name", "make", "found"),
    [
        ("metrics.jsonl", Path.mkdir, "a folder, not the file"),
        ("tb", lambda p: p.write_text("x\n"), "a file, not the folder"),
    ],  # fmt: skip
)
def test_a_run_file_of_the_wrong_kind_is_refused_on_resume_inone_line(
    finished_run: Path, tmp_path: Path, capsys, name, make, found
) -> None:
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    path = out / name
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    make(path)
    history = (out / HISTORY_FILE).read_text()
    capsys.readouterr()
    assert train_command.cli([*hostile_args(out, iterations=2), "--resume"]) == 2
    captured = capsys.readouterr()
    line = one_line(captured.err)
    assert f"run folder {out}: {name} is {found}" in line and "Move it away" in line
    assert "resuming" not in captured.out  # refused before any checkpoint or model loads
    assert (out / HISTORY_FILE).read_text() == history


def test_a_run_folder_that_breaks_during_an_adapter_publish_says_so_inone_line(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    # the whole folder becomes a file in iteration 1's rollouts: the publish after its update
    # is the first write that fails, then TensorBoard's (its writer thread and its close)
    sabotage = f"{{sabotage: {out}, sabotage_after: 12}}"
    argv = [
        *hostile_args(out, iterations=3),
        "--env-kwargs",
        sabotage,
        "--report-to",
        "tensorboard",
    ]
    assert train_command.cli(argv) == 1
    err = capsys.readouterr().err
    line = one_line(err)
    assert f"cannot write {out} (a file is where a folder should be)" in line
    assert "--resume" in line
    # TensorBoard's failure at the row's write is one secondary line; its close is quiet
    (tb_line,) = [x for x in err.splitlines() if "--report-to tensorboard" in x]
    assert "failed at step 1" in tb_line and "failed at close" not in err
    kept = out.with_name("run.moved-away")
    assert [r["iteration"] for r in read_metrics(kept)] == [0, 1]  # iteration 1's row is kept


def test_init_adapter_of_a_run_with_no_checkpoint_yet_names_that(tmp_path: Path, capsys) -> None:
    first = tmp_path / "first"
    broken = "{fault: raise, broken: [t0, t1, t2, t3]}"  # stops in iteration 0, before a save
    assert train_command.cli([*hostile_args(first), "--env-kwargs", broken]) == 1
    assert not (first / "checkpoints").exists()
    capsys.readouterr()
    argv = [*hostile_args(tmp_path / "second"), "--init-adapter", str(first)]
    assert train_command.cli(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{first} is a run folder with no complete checkpoint yet" in line
    assert f"entrogym train --resume --out {first}" in line
    assert "neither" not in line


def _killed_in_first_save(finished_run: Path, out: Path) -> None:
    """``out``: ``finished_run`` as a run killed while writing its first checkpoint leaves it
    (the save's folder still named ``.tmp-PID``, of a process that is gone, no meta.json)."""
    shutil.copytree(finished_run, out)
    ckpt = out / "checkpoints"
    (ckpt / "iter-000000").rename(ckpt / "iter-000000.tmp-999999999")
    (ckpt / "iter-000000.tmp-999999999" / "meta.json").unlink()
    (ckpt / "latest").unlink()


@pytest.mark.parametrize("resume", [False, True])
def test_a_leftover_temporary_checkpoint_never_counts_as_one(
    finished_run: Path, tmp_path: Path, capsys, resume: bool
) -> None:
    out = tmp_path / "run"
    _killed_in_first_save(finished_run, out)
    # a run with no checkpoint starts over in its folder, fresh start or --resume alike
    argv = [*hostile_args(out), *(["--resume"] if resume else [])]
    assert train_command.cli(argv) == 0, capsys.readouterr().err
    assert "already holds a run" not in capsys.readouterr().err
    assert _events(out) == [("start", 0), ("restart", 0)]
    assert [r["iteration"] for r in read_metrics(out)] == [0]  # the old row was dropped
    saved = sorted(p.name for p in (out / "checkpoints").iterdir() if "iter-" in p.name)
    assert saved == ["iter-000000"]  # the killed save's folder is gone


def test_a_resume_that_finds_no_intact_checkpoint_is_recorded_as_a_restart(
    finished_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    (out / "checkpoints" / "iter-000000" / "meta.json").unlink()
    with pytest.warns(UserWarning, match="ignoring checkpoint"):
        assert train_command.cli([*hostile_args(out), "--resume"]) == 0
    assert _events(out) == [("start", 0), ("restart", 0)]  # nothing was resumed
    assert [r["iteration"] for r in read_metrics(out)] == [0]
