"""benchmarks/entropy_estimators.py on a tiny model: every estimator of a fixed policy's batch
entropy, the relative one 1.0 for the base model itself, and its bad input."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import entropy_estimators  # noqa: E402


def test_the_base_models_batches_read_one_by_the_relative_estimator(capsys):
    report = entropy_estimators.main(["--batches", "2", "--model", "tiny-random-llama"])
    estimators = report["estimators"]
    assert set(estimators) == {"sampled", "exact", "relative"}
    assert estimators["relative"]["values"] == pytest.approx([1.0, 1.0], abs=1e-5)
    assert all(v > 0 for v in estimators["exact"]["values"])
    assert estimators["exact"]["values"][0] != estimators["exact"]["values"][1]  # two batches
    assert report["adapter"] is None and '"relative"' in capsys.readouterr().out


def test_a_missing_adapter_is_one_line_before_any_model_loads(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        entropy_estimators.main(["--adapter", str(tmp_path / "none")])
    assert stop.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith("no such folder; give a saved adapter's folder")
    )
