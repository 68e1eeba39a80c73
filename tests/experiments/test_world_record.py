"""The world's record for the demo (``entrogym.experiments.world_record``): the paired
differences it keeps, the line the demo prints and when that line says the effect shows."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from run_folders import write_run

from entrogym.experiments import report
from entrogym.experiments.report import world_story_line
from entrogym.experiments.sequential_report import measured_line
from entrogym.experiments.world_record import (
    effect_shown,
    record_world,
    recorded_world,
    world_line,
)
from entrogym.train.evaluation.interval import mean_interval

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "studies"))

import world_presets  # noqa: E402


def _runs(tmp_path: Path, finals: dict[str, list[float]]) -> list[Path]:
    """One folder per label and seed, ending at ``finals[label][seed]``."""
    dirs = []
    for label, values in finals.items():
        for seed, final in enumerate(values):
            d = tmp_path / f"{label}-s{seed}"
            write_run(d, seed=seed, entropies=[2.0, 1.5], evals={0: 0.1, 1: final})
            dirs.append(d)
    return dirs


def test_the_record_keeps_each_configurations_paired_difference_against_grpo(tmp_path):
    dirs = _runs(tmp_path, {"grpo": [0.4, 0.5, 0.3], "held": [0.2, 0.3], "repo-r": [0.5, 0.5, 0.5]})
    made = record_world(dirs, date="2026-12-06", provenance="here")
    by = {c["label"]: c for c in made["claims"]}
    assert (made["date"], made["provenance"], made["runs"]) == ("2026-12-06", "here", 8)
    assert set(by) == {"held", "repo-r", "repo-d", "adapo"}
    # independent arithmetic: held seeds 0-1 against grpo's, repo-r all three
    assert by["held"]["seeds"] == [0, 1]
    assert by["held"]["difference"]["mean"] == pytest.approx(-0.2)
    expected = asdict(mean_interval([0.1, 0.0, 0.2]))
    assert by["repo-r"]["difference"] == pytest.approx(expected, rel=1e-9)
    assert by["adapo"]["difference"] is None and by["repo-d"]["seeds"] == []
    line = world_line(made)
    assert line == (
        "TGC minus GRPO's by seed: held -0.200 (n=2), repo-r +0.100 (n=3); no "
        "effect shown (goal: +0.05 over >= 6 seeds, 95 % interval above 0)"
    )
    assert "adapo" not in line
    unpaired = {"claims": [{"label": "held", "seeds": [], "difference": None}]}
    assert world_line(unpaired) == "no configuration ran beside GRPO on a common seed"


@pytest.mark.parametrize(
    ("diffs", "shown"),
    [
        ([0.1] * 5 + [0.12], True),  # six seeds, mean 0.103, interval above 0
        ([0.1, 0.12, 0.08, 0.1, 0.11], False),  # five seeds: too few for the goal
        ([0.04, 0.045, 0.04, 0.05, 0.04, 0.045], False),  # above 0, but less than +0.05
        ([0.4, -0.3, 0.4, -0.3, 0.4, -0.2], False),  # mean +0.067, interval spans 0
    ],
)
def test_the_effect_shows_only_as_the_goal_says(diffs, shown):
    assert effect_shown(mean_interval(diffs)) is shown
    claims = [{"label": "repo-r", "seeds": list(range(len(diffs))),
               "difference": asdict(mean_interval(diffs))}]  # fmt: skip
    line = world_line({"claims": claims})
    assert line.endswith("interval above 0): repo-r") is shown
    assert ("no effect shown" in line) is not shown


def test_the_shipped_record_gives_the_demo_its_world_line_and_leaves_the_sequential_one():
    world = recorded_world()
    assert world is not None and "benchmarks/results/world-presets" in world["source"]
    assert world["line"].startswith("TGC minus GRPO's by seed: held ")
    # the world's record in data/ is not a sequential result: the sequential line is unchanged
    sequential = measured_line(Path("no-such-summary.json"))
    assert sequential is not None and "neg-abs" in sequential["source"]
    s = {"accuracy_before": 0.3, "wall_s": 1.0, "runs": [], "world": world,
         "settings": {"seeds": [], "workers": 1, "threads": 1}}  # fmt: skip
    text = report(s)
    assert f"the multi-turn world ({world['date']}; " in text
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "the multi-turn world" not in report({**s, "world": None})
    # docs/demo.md shows the line as the shipped record prints it
    demo_md = (Path(__file__).resolve().parents[2] / "docs" / "demo.md").read_text()
    shown = demo_md.split("With the record as it ships it\nreads:\n\n```\n")[1].split("\n```")[0]
    assert shown == world_story_line(world)


def test_the_study_records_every_kept_run_and_refuses_without_provenance(tmp_path, capsys):
    kept = tmp_path / "kept"
    kept.mkdir()
    _runs(kept, {"grpo": [0.4, 0.5], "adapo": [0.45, 0.6]})
    out = tmp_path / "world.json"
    args = ["--archive-only", "--archive", str(kept), "--out", str(tmp_path / "runs"),
            "--presets", "grpo", "--record", str(out)]  # fmt: skip
    with pytest.raises(SystemExit):
        world_presets.main(args)
    assert "--record needs --provenance" in capsys.readouterr().err and not out.exists()
    assert world_presets.main([*args, "--provenance", "kept runs"]) == 0
    saved = json.loads(out.read_text())
    adapo = next(c for c in saved["claims"] if c["label"] == "adapo")
    assert saved["runs"] == 4 and adapo["seeds"] == [0, 1]
    assert adapo["difference"]["mean"] == pytest.approx(0.075)


def test_the_demos_package_loads_no_plotting_for_the_world_record():
    # the record's compare draws with matplotlib; the demo's start (and its one-line errors)
    # must not pay for it
    code = "import sys, entrogym.experiments; sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
