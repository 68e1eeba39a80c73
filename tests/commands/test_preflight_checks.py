"""Bad input to ``entrogym train`` fails before any model loads: one line, exit code 2.
Ctrl-C says how to resume."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrogym.commands import train as train_command

TINY = ["--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32"]
UNWRITABLE = "/proc/entrogym-no-such-dir/run"  # not writable even for root


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--env", "nope/NoSuchEnv-v0"], "nope/NoSuchEnv-v0"),
        (["--env", "no_such_module_xyz:examples/X-v0"], "no_such_module_xyz"),
        (["--algo", "ppo"], "unknown algorithm 'ppo'; presets: rloo"),
        (["--model", "/no/such/model"], "/no/such/model"),
        (["--out", UNWRITABLE], "cannot write"),
    ],
)
def test_bad_input_fails_in_one_line(extra, needle, tmp_path: Path, capsys) -> None:
    argv = [*TINY, "--out", str(tmp_path / "run"), *extra]
    assert train_command.cli(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err
    assert not (tmp_path / "run").exists()  # nothing was written


def test_out_that_is_a_file_and_an_unwritable_cache(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "file").write_text("keep")
    assert train_command.cli([*TINY, "--out", str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err
    monkeypatch.setenv("ENTROGYM_CACHE", "/proc/entrogym-cache")
    assert train_command.cli([*TINY, "--out", str(tmp_path / "run")]) == 2
    assert "ENTROGYM_CACHE" in capsys.readouterr().err


def test_the_checks_run_before_anything_heavy_is_imported(tmp_path: Path) -> None:
    code = (
        "import sys; from entrogym.commands.train import cli; "
        f"rc = cli(['--model', '/no/such/model', '--out', {str(tmp_path)!r}]); "
        "heavy = {'transformers', 'peft', 'vllm'} & set(sys.modules); "
        "assert not heavy, f'{heavy} imported'; sys.exit(rc)"
    )
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert time.perf_counter() - start < 30  # well under a second on an idle machine


def test_ctrl_c_says_how_to_resume(tmp_path: Path, capsys, monkeypatch) -> None:
    import entrogym.train.trainer as trainer

    def interrupted(config, shutdown=None):  # the fault: Ctrl-C while the run trains
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "train", interrupted)
    assert train_command.cli([*TINY, "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert "interrupted; resume with --resume" in err and "Traceback" not in err
