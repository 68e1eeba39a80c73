"""Filesystem faults and a stopped run are one line naming the file and what to do, not a
traceback (finding 8); rows already written stay, and ``config_history.jsonl`` records only
what happened."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path

import hostile_envs  # noqa: F401  (registers faults/Hostile-v0)
import pytest
from hostile_cli import hostile_args, one_line

import entrogym.train.folder.safety as run_folder
from entrogym.commands import train as train_command
from entrogym.train.folder.checkpoint import latest_checkpoint
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.folder.safety import HISTORY_FILE


def test_an_unwritable_config_on_resume_is_one_line_and_not_recorded(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    out = tmp_path / "run"
    assert train_command.cli(hostile_args(out)) == 0
    history = (out / HISTORY_FILE).read_text()
    real = run_folder.atomic_write_text

    def refuse_config(path, text):  # the fault: config.yaml cannot be replaced
        if Path(path).name == "config.yaml":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, text)

    monkeypatch.setattr(run_folder, "atomic_write_text", refuse_config)
    capsys.readouterr()
    # extending --iterations is allowed and rewrites config.yaml
    assert train_command.cli([*hostile_args(out, iterations=2), "--resume"]) == 1
    line = one_line(capsys.readouterr().err)
    assert f"cannot write {out / 'config.yaml'} (Permission denied)" in line
    assert "--resume" in line
    assert (out / HISTORY_FILE).read_text() == history  # nothing resumed, nothing recorded
    assert [r["iteration"] for r in read_metrics(out)] == [0]


@pytest.mark.parametrize("folder", ["checkpoints", "adapters"])
def test_a_run_folder_that_breaks_mid_run_keeps_its_rows(tmp_path: Path, capsys, folder) -> None:
    out = tmp_path / "run"
    sabotage = f"{{sabotage: {out / folder}, sabotage_after: 12}}"  # in iteration 1
    argv = [*hostile_args(out, iterations=3, checkpoint_every=1), "--env-kwargs", sabotage]
    assert train_command.cli(argv) == 1
    line = one_line(capsys.readouterr().err)
    assert f"{out / folder}" in line and "--resume" in line
    rows = read_metrics(out)
    assert [r["iteration"] for r in rows] == [0, 1]  # iteration 1's row is kept
    if folder == "adapters":
        assert latest_checkpoint(out).name == "iter-000000"


def test_too_many_env_errors_stop_the_run_inone_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    kwargs = "{fault: raise, broken: [t0, t1, t2, t3]}"
    assert train_command.cli([*hostile_args(out), "--env-kwargs", kwargs]) == 1
    line = one_line(capsys.readouterr().err)
    assert "8 of 8 episodes failed on env errors, more than max_env_error_fraction=0.5" in line
    assert re.search(
        r"the first: env 'faults/Hostile-v0', task 't\d', step: ConnectionError: "
        "grader service unreachable$",
        line,
    )
    events = [json.loads(x)["event"] for x in (out / HISTORY_FILE).read_text().splitlines()]
    assert events == ["start", "stopped"]
