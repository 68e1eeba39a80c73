"""``entrogym train`` shows progress bars (tqdm, on stderr) for the iterations, each iteration's
rollouts and update, the target probe and the held-out evaluation when ``ENTROGYM_PROGRESS=1``
forces them on, and none by default off a terminal (pytest's stderr, a log file, CI)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from entrogym.commands.train import cli
from entrogym.train.progress import PROGRESS_ENV

ARGV = [
    "--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32",
    "--iterations", "1", "--tasks-per-iter", "2", "--samples", "2",
    "--early-stop-min-per-task", "2", "--max-response-tokens", "4",
    "--env", "entrogym/Arithmetic-v0", "--env-kwargs", "{num_train: 8, num_test: 4}",
    "--algo", "grpo", "--algo.lever", "entropy-constraint", "--algo.minibatch-size", "2",
    "--algo.controller.target-probe", "1",
    "--eval-env", "entrogym/Arithmetic-v0", "--eval-every", "1", "--eval-tasks", "3",
]  # fmt: skip
# "desc:   0%|   | 0/total [00:00<?, ?unit/s]": each bar's first drawing
BARS = {
    "iterations": ("1", "iter"),
    "target probe": ("1", "batches"),
    "rollouts": ("4", "episodes"),  # 2 tasks x 2 samples
    "update": ("4", "steps"),  # 4 rows in minibatches of 2, two epochs
    "eval": ("3", "episodes"),  # 3 held-out tasks x 1 sample
}


def _train(out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    assert cli([*ARGV, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_bars_show_counts_when_forced_and_stay_off_a_non_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROGRESS_ENV, "1")
    out, err = _train(tmp_path / "forced", capsys)
    for desc, (total, unit) in BARS.items():
        drawn = re.search(rf"{desc}:\s+\d+%\|[^|]*\| \d+/{total} \[[^\]]*{unit}/s\]", err)
        assert drawn, f"no {desc} bar counting to {total} {unit} in stderr:\n{err}"
    row = json.loads((tmp_path / "forced" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["optimizer_steps"] + row["skipped_steps"] == int(BARS["update"][0])
    assert "iter 0:" in out and "%|" not in out  # the iteration line on stdout, no bars there

    monkeypatch.delenv(PROGRESS_ENV)
    quiet_out, quiet_err = _train(tmp_path / "default", capsys)
    assert not any(f"{desc}:" in quiet_err for desc in BARS), quiet_err
    assert _untimed(quiet_out) == _untimed(out)  # the same lines on stdout either way


def _untimed(text: str) -> list[str]:
    """``text``'s lines without their timings (``12.3s``, ``(4 s)``)."""
    return [re.sub(r"[\d.]+ ?s\b", "", line) for line in text.splitlines()]
