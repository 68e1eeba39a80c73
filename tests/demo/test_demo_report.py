"""The demo's goal per seed, its verdict and its table (``entrogym.demo.report``)."""

from __future__ import annotations

from pathlib import Path

from entrogym.commands.demo import cli as demo_cli
from entrogym.demo import goal, report


def record(label: str, algo: str, seed: int, ratio: float, **extra) -> dict:
    return {"label": label, "algo": algo, "seed": seed, "entropy": [2.0, 2.0 * ratio],
            "entropy_ratio": ratio, "reward": [0.3, 0.9], "accuracy_first": 0.5,
            "accuracy_after": 0.8, "wall_s": 5.0, **extra}  # fmt: skip


def summary(records: list[dict]) -> dict:
    return {"accuracy_before": 0.3, "wall_s": 10.0, "runs": records,
            "settings": {"seeds": sorted({r["seed"] for r in records}), "workers": 2,
                         "threads": 1}}  # fmt: skip


def test_goal_holds_only_when_it_holds_on_every_seed() -> None:
    r = "repo-r --algo.controller.max 0.5"
    both = [record("grpo", "grpo", 0, 0.4), record(r, "repo-r", 0, 0.8),
            record("grpo", "grpo", 1, 0.3), record(r, "repo-r", 1, 0.75)]  # fmt: skip
    assert goal(both)["held"] == {r: True}
    one = [*both[:3], record(r, "repo-r", 1, 0.6)]
    result = goal(one)
    assert result["held"] == {r: False}
    assert [c["holds"] for c in result["checks"]] == [True, False]
    # GRPO not falling far enough fails the seed even when REPO-R keeps its entropy
    assert not goal([record("grpo", "grpo", 0, 0.6), record(r, "repo-r", 0, 0.9)])["held"][r]
    assert goal([record(r, "repo-r", 0, 0.9)])["checks"] == []  # no GRPO on that seed


def test_report_says_per_seed_what_held_and_flags_overshoots() -> None:
    records = [record("grpo", "grpo", 1, 0.2), record("repo-r", "repo-r", 1, 0.15)]
    text = report(summary(records))
    assert "seed 1: repo-r ended at 0.15, GRPO at 0.20 (fell far enough) -> did NOT hold" in text
    assert "repo-r: goal did NOT hold (0 of 1 seeds)" in text
    records[1].update(entropy=[2.0, 1.8], entropy_ratio=0.9)
    assert "repo-r: goal HELD (1 of 1 seeds)" in report(summary(records))
    assert "overshot" not in report(summary(records))
    records[1].update(entropy=[2.0, 7.0, 2.0], entropy_ratio=1.0)  # rose, then came back
    text = report(summary(records))
    assert "HELD" in text and "ROSE to 3.50x" in text
    assert "overshot on 1 of 1 seeds: met by the goal's letter, not entropy preservation" in text
    no_eval = summary([{**records[0], "accuracy_first": None, "accuracy_after": None}])
    no_eval["accuracy_before"] = None
    assert "base model: -" in report(no_eval) and "goal not checked" in report(no_eval)


def test_demo_refuses_a_used_folder(tmp_path: Path, capsys) -> None:
    (tmp_path / "old.txt").write_text("keep me")
    assert demo_cli(["--out", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err and (tmp_path / "old.txt").exists()
