"""examples/custom_entropy_control.py: a new control is one class plus one registry line."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from entrogym.algos import CONTROLS, get_algorithm, make_control

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_entropy_control.py"


def test_custom_control_example_runs_in_the_bandit_lab(capsys: pytest.CaptureFixture[str]):
    try:
        namespace = runpy.run_path(str(EXAMPLE), run_name="custom_entropy_control_test")
        assert CONTROLS["sampled-entropy-bonus"] is namespace["SampledEntropyBonus"]
        preset = namespace["DAPO_SAMPLED_BONUS"]
        control = make_control(preset)
        assert preset.knobs[-1] == "zeta_init" and control.metrics()["beta"] == 0.05
        results = namespace["main"](seeds=2, iters=25)
    finally:
        CONTROLS.pop("sampled-entropy-bonus", None)
    dapo, bonus = results["dapo"], results["dapo-sampled-bonus"]
    assert dapo["entropy_initial"] == bonus["entropy_initial"]  # same problems per seed
    assert bonus["entropy_final"] > dapo["entropy_final"] + 0.2  # the bonus keeps entropy
    assert bonus["reward_final"] > 0.8
    assert "dapo-sampled-bonus" in capsys.readouterr().out
    assert get_algorithm("dapo").control == "none"
