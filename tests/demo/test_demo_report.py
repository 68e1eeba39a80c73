"""The demo's goal per seed, its verdict and its table (``entrogym.demo.report``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrogym.commands.demo import cli as demo_cli
from entrogym.demo import goal, report


def record(label: str, seed: int, entropy: list[float], accuracy: float = 0.8, **extra) -> dict:
    """A run's record as ``train_one`` returns it; a label other than grpo is controlled and
    aims at its first iteration's entropy."""
    controlled = label != "grpo"
    return {"label": label, "algo": label.split()[0], "seed": seed, "entropy": entropy,
            "entropy_ratio": entropy[-1] / entropy[0], "reward": [0.3, 0.9],
            "accuracy_first": 0.5, "accuracy_after": accuracy, "wall_s": 5.0,
            "controlled": controlled,
            "entropy_target": [entropy[0]] * len(entropy) if controlled else [None] * len(entropy),
            **extra}  # fmt: skip


def summary(records: list[dict]) -> dict:
    return {"accuracy_before": 0.3, "wall_s": 10.0, "runs": records,
            "settings": {"seeds": sorted({r["seed"] for r in records}), "workers": 2,
                         "threads": 1}}  # fmt: skip


FELL = [2.0, 1.5, 0.9, 0.6]  # GRPO ends at 0.3 of its start
HELD = [2.0, 1.2, 1.6, 2.3]  # 0.6 at the 2nd iteration is not tracked; 1.6 and 2.3 are in band


def test_goal_is_the_band_from_the_third_iteration_grpo_falling_and_accuracy() -> None:
    r = "grpo --algo.lever cov-neutral"
    both = [record("grpo", 0, FELL), record(r, 0, HELD), record("grpo", 1, FELL),
            record(r, 1, HELD, accuracy=0.75)]  # fmt: skip
    result = goal(both)
    assert result["held"] == {r: True}
    assert result["checks"][0]["max_excursion"] == pytest.approx(0.2)  # 1.6 / 2.0 - 1
    # one excursion past +-25 % at any tracked iteration fails that seed
    out = goal([*both[:3], record(r, 1, [2.0, 2.0, 2.0, 2.52, 2.0])])
    assert out["held"] == {r: False} and [c["holds"] for c in out["checks"]] == [True, False]
    assert not out["checks"][1]["in_band"]
    # GRPO not falling to half, or accuracy more than 0.05 below GRPO's, fails the seed too
    assert not goal([record("grpo", 0, [2.0, 1.8, 1.5]), record(r, 0, HELD)])["held"][r]
    low = goal([record("grpo", 0, FELL, accuracy=0.8), record(r, 0, HELD, accuracy=0.74)])
    assert not low["held"][r] and not low["checks"][0]["accurate"]
    assert goal([record(r, 0, HELD)])["checks"] == []  # no GRPO on that seed


def test_report_prints_tracking_and_says_why_a_seed_failed() -> None:
    r = "repo-r"
    records = [record("grpo", 1, FELL), record(r, 1, [2.0, 1.0, 0.6, 0.5], accuracy=0.6)]
    text = report(summary(records))
    assert "largest excursion 75%" in text and "left the band by 75%" in text
    assert "accuracy 0.600 against GRPO's 0.800" in text
    assert "repo-r: goal did NOT hold (0 of 1 seeds)" in text
    records[1] = record(r, 1, HELD)
    assert "repo-r: goal HELD (1 of 1 seeds)" in report(summary(records))
    assert " track " in text and "max exc" in text
    no_eval = summary([{**records[0], "accuracy_first": None, "accuracy_after": None}])
    no_eval["accuracy_before"] = None
    assert "base model: -" in report(no_eval) and "goal not checked" in report(no_eval)


def test_demo_refuses_a_used_folder(tmp_path: Path, capsys) -> None:
    (tmp_path / "old.txt").write_text("keep me")
    assert demo_cli(["--out", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err and (tmp_path / "old.txt").exists()
