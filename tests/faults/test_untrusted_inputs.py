"""Untrusted inputs stay bounded (findings 8 and 10): a YAML alias bomb is refused in well
under a second, naming the file; ``plot`` names a malformed line and copes with repeated
iteration rows; a fresh run does not write into a folder that holds something else."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrogym.commands import plot as plot_command
from entrogym.commands import train as train_command

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32"]

# 9 levels of 9 aliases: under 600 bytes of YAML, 9**9 (387 million) strings expanded
BOMB = "\n".join(
    ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    + ["env_kwargs: {payload: *a8}"]
)
DEEP = "env_kwargs: " + "[" * 5000 + "]" * 5000


def _train_in_a_box(argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """``entrogym train ARGV`` in a child limited to 3 GiB of address space (a bomb that goes
    off must not take the machine down) and its wall time."""
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
        f"from entrogym.commands.train import cli; sys.exit(cli({argv!r}))"
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    return proc, time.monotonic() - start


@pytest.mark.parametrize(("text", "why"), [(BOMB, "expands to more than"), (DEEP, "nested")])
def test_a_yaml_bomb_config_is_refused_quickly(tmp_path: Path, text: str, why: str) -> None:
    config = tmp_path / "bomb.yaml"
    config.write_text(text + "\n")
    proc, seconds = _train_in_a_box(["--config", str(config), "--out", str(tmp_path / "run")])
    assert seconds < 60
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert str(config) in proc.stderr and why in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_yaml_bomb_in_a_run_folder_is_refused_on_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "entrogym-run.json").write_text('{"format": 1}\n')
    (run / "config.yaml").write_text(BOMB + "\n")
    (run / "checkpoints").mkdir()
    proc, seconds = _train_in_a_box([*TINY, "--out", str(run), "--resume"])
    assert seconds < 60
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert str(run / "config.yaml") in proc.stderr and "expands to more than" in proc.stderr


def _write_rows(run: Path, lines: list[str]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))


def _row(it: int, entropy: float) -> str:
    return json.dumps({"kind": "train", "iteration": it, "algo": "grpo", "entropy": entropy})


def test_plot_names_a_line_that_is_not_an_object(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    _write_rows(run, [_row(0, 1.0), "[1, 2, 3]", _row(1, 0.5)])
    assert plot_command.cli([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{run / 'metrics.jsonl'}: line 2 is a list, not a JSON object" in err


def test_plot_keeps_the_last_of_repeated_iteration_rows(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    _write_rows(run, [_row(0, 1.0), _row(1, 0.9), _row(1, 0.5), _row(2, 0.4)])
    assert plot_command.cli([str(run), "--out", str(tmp_path / "plots")]) == 0
    captured = capsys.readouterr()
    assert (tmp_path / "plots" / "entropy.png").is_file()
    assert "iteration 1 has 2 train rows (lines 2, 3); plotting the last" in captured.err

    from entrogym.train.evaluation.plots import load_run

    loaded = load_run(run)
    assert loaded.entropy == {0: 1.0, 1: 0.5, 2: 0.4}
    assert loaded.cumulative == {0: 1.0, 1: 1.5, 2: 1.9}


def test_a_fresh_run_refuses_a_folder_that_holds_something_else(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("my notes\n")
    assert train_command.cli([*TINY, "--out", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(folder) in err and "notes.txt" in err
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]  # nothing written


@pytest.mark.parametrize("depth", [65, 1200, 20000])
def test_deep_nesting_is_refused_naming_the_source_whoever_notices_it(depth: int) -> None:
    """Past MAX_DEPTH the event count refuses; far past it libyaml's scanner refuses first
    (PyYAML 6.0.4's C loader): either way one refusal naming the source, never a parse error
    without it."""
    from entrogym.yaml_limits import MAX_DEPTH, YamlTooLarge, check_yaml

    assert depth > MAX_DEPTH
    with pytest.raises(YamlTooLarge, match=r"^cfg\.yaml is nested more than \d+ levels deep"):
        check_yaml("a: " + "[" * depth + "]" * depth, "cfg.yaml")
    inner = MAX_DEPTH - 1  # the mapping is the first level
    check_yaml("a: " + "[" * inner + "]" * inner, "cfg.yaml")  # at the limit: accepted
