"""``--algo.is-correction`` through ``entrogym train`` on tiny-random-llama with the hf engine:
the update weights the policy gradient by the sampler-mismatch weights and logs them; a bad
mode is one line before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrogym.commands.train import cli

RUN = [
    "--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32",
    "--env", "entrogym/Arithmetic-v0", "--env-kwargs", "{num_train: 8, num_test: 4}",
    "--iterations", "2", "--tasks-per-iter", "2", "--samples", "3",
    "--early-stop-min-per-task", "3", "--max-response-tokens", "6", "--algo", "grpo",
]  # fmt: skip


def test_a_corrected_run_logs_its_importance_weights(tmp_path: Path) -> None:
    out = tmp_path / "run"
    options = ["--algo.is-correction", "token_truncate", "--algo.is-clip-max", "2"]
    assert cli([*RUN, *options, "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("kind") == "train"]
    assert len(train) == 2
    for row in train:
        # an fp32 engine and an fp32 learner nearly agree: weights near 1, none dropped
        assert 0 < row["is_weight_mean"] <= 2
        assert row["is_weight_mean"] == pytest.approx(1.0, abs=0.05)
        assert row["is_weight_zero_share"] == 0
    saved = (out / "config.yaml").read_text()
    assert "is_correction: token_truncate" in saved and "is_clip_max: 2.0" in saved


def test_a_bad_mode_is_one_line_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bad"
    assert cli([*RUN, "--algo.is-correction", "nope", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "unknown sampler correction mode 'nope'; use one of token_truncate" in err[0]
    assert not out.exists()
