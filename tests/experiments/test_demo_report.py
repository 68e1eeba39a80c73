"""The demo's goal per seed, its verdict and its table (``entrogym.experiments.report``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrogym.commands.demo import cli as demo_cli
from entrogym.experiments import goal, report


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


LONG = "grpo --algo.lever kl-cov --algo.mask high-entropy"


def default_records(seeds: tuple[int, ...] = (0,)) -> list[dict]:
    """The default runs' records, labelled as the demo labels them, plus a long plain spec."""
    from entrogym.commands.demo_runs import parse_run
    from entrogym.experiments import DEFAULT_RUNS

    out = []
    for seed in seeds:
        for text, entropy in zip((*DEFAULT_RUNS, LONG), (FELL, FELL, HELD, HELD), strict=True):
            run = parse_run(text)
            out.append({**record(run.label, seed, entropy), "spec": run.spec})
    return out


def test_the_report_fits_100_columns_with_one_short_name_per_run() -> None:
    records = default_records((0, 1))
    text = report(summary(records))
    assert max(len(line) for line in text.splitlines()) <= 100
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("run "))
    rows = [line.split()[0] for line in lines[header + 1 : header + 9]]
    assert rows == ["grpo", "repo-r", "held", "run#4"] * 2
    # what each named run is, under the table; every word of the spec is there
    assert "held = grpo --algo.lever entropy-constraint" in text
    assert "run#4 = grpo --algo.lever kl-cov --algo.mask high-entropy" in text
    assert "held: goal HELD (2 of 2 seeds)" in text and "run#4: goal HELD" in text
    assert "seed 1, held: largest excursion 20%" in text


def test_the_first_screen_tells_the_story_collapse_pass_at_k_and_the_sequential_line() -> None:
    records = default_records()
    for r, p16 in zip(records, (0.81, 0.9, 1.0, 0.95), strict=True):
        r["pass_at_k"] = {"1": p16 / 2, "4": p16 - 0.1, "16": p16, "distinct": 1.5}
    s = summary(records) | {
        "base_pass_at_k": {"1": 0.25, "4": 0.6, "16": 0.95},
        "sequential": {"source": "measured", "date": "2026-12-05", "line": "neg-abs, ..."},
    }
    s["settings"] |= {"pass_tasks": 16, "pass_samples": 16}
    lines = report(s).splitlines()
    screen = "\n".join(lines[:24])
    assert lines[0] == "seed 0, grpo: entropy 2.000 -> 0.600, 0.30 of its start"
    assert "seed 0, held: entropy 2.000 -> 2.300, at most 20% from its target" in screen
    header = next(line for line in lines if line.startswith("pass@k on 16 held-out tasks"))
    assert header.split()[-3:] == ["@1", "@4", "@16"]
    assert any(line.split() == ["base", "model", "0.250", "0.600", "0.950"] for line in lines)
    assert any(line.split() == ["held", "s0", "0.500", "0.900", "1.000"] for line in lines)
    assert "sequential, newest recorded (2026-12-05; measured): neg-abs, ..." in screen
    assert max(len(line) for line in lines) <= 100
    without = [{k: v for k, v in r.items() if k != "pass_at_k"} for r in records]
    assert not any(line.startswith("pass@k") for line in report(summary(without)).splitlines())


def test_the_sequential_line_is_the_newest_recorded_result(tmp_path) -> None:
    import json
    import os

    from entrogym.experiments.sequential_report import measured_line

    shipped = measured_line(tmp_path / "none.json")
    assert shipped is not None and shipped["date"] == "2026-12-05"
    assert "neg-abs" in shipped["source"] and "docs/results.md" in shipped["source"]
    # the nine seeds' mean of held - grpo on B, as the results log gives it (+0.059)
    assert shipped["line"] == (
        "neg-abs, accuracy on B after stage 2: held start 0.59, grpo start 0.53 (means over "
        "seeds 0-8); held higher on 4 of 9; mean gain 0.06"
    )
    mine = {"held": "held", "pair": {"name": "p"},
            "runs": [{"label": label, "seed": 3, "stage2": {"accuracy": acc},
                      "stage1": {"pass_at_k": {"16": 1.0}, "max_excursion": 0.1}}
                     for label, acc in (("grpo", 0.2), ("held", 0.5))]}  # fmt: skip
    line = (
        "p, accuracy on B after stage 2: held start 0.50, grpo start 0.20 (seed 3); mean gain 0.30"
    )
    (tmp_path / "s.json").write_text(json.dumps({**mine, "date": "2026-12-06"}))
    got = measured_line(tmp_path / "s.json")
    assert got == {"source": str(tmp_path / "s.json"), "date": "2026-12-06", "line": line}
    # an older local summary (dated by its file's time when it has no date) loses to the shipped
    (tmp_path / "old.json").write_text(json.dumps(mine))
    os.utime(tmp_path / "old.json", (1_700_000_000, 1_700_000_000))  # 2023-11-14
    assert measured_line(tmp_path / "old.json") == shipped
    (tmp_path / "same-day.json").write_text(json.dumps({**mine, "date": "2026-12-05"}))
    assert measured_line(tmp_path / "same-day.json")["line"] == line


def test_a_labelled_grpo_is_still_the_goals_baseline() -> None:
    records = [{**record("base", 0, FELL), "controlled": False, "spec": "grpo"},
               {**record("held", 0, HELD), "spec": "grpo --algo.lever entropy-constraint"}]  # fmt: skip
    assert goal(records)["held"] == {"held": True}


def test_the_entropy_plot_draws_the_held_runs_band_once_under_short_names(
    tmp_path, monkeypatch
) -> None:
    import json

    from matplotlib import pyplot as plt

    from entrogym.experiments.report import draw_bands, plot_demo
    from entrogym.train.evaluation import plots

    figures = []
    make = plots.entropy_figure
    monkeypatch.setattr(
        plots, "entropy_figure", lambda runs: figures.append(make(runs)) or figures[-1]
    )

    records = default_records()[:3]  # the default runs: grpo, repo-r, held
    records[2]["entropy_target"] = [1.984] * len(HELD)  # a probed target
    # held tracked another estimate than the batch's sampled entropy the rows lead with
    records[2]["entropy_tracked"] = [h + 0.5 for h in HELD]
    long = default_records()[3]
    for r in [*records, long]:  # run folders with the rows the plots read
        folder = tmp_path / r["label"].replace(" ", "_")
        folder.mkdir()
        rows = [{"iteration": i, "algo": r["label"].split()[0], "entropy": h, "reward_mean": 0.5}
                for i, h in enumerate(r["entropy"])]  # fmt: skip
        (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        r["folder"] = str(folder)
    written = plot_demo(records, tmp_path / "plots")
    # the last controlled run is the one whose band is drawn: a variant after held takes its place
    plot_demo([*records, long], tmp_path / "plots")
    assert [p.name for p in written] == ["entropy.png", "accuracy_vs_cumulative_entropy.png"]
    assert all(p.stat().st_size > 0 for p in written)
    entropy, after = figures
    legend = [t.get_text() for t in entropy.axes[0].get_legend().get_texts()]
    # one line per run under its short name, and one band: held's (repo-r aims at its first
    # iteration's entropy; no band of its own)
    assert legend == ["grpo", "repo-r", "held", "held ±25%"]
    assert len(entropy.axes[0].collections) == 1
    assert [t.get_text() for t in after.axes[0].get_legend().get_texts()][-1] == "run#4 ±25%"
    lines = {line.get_label(): list(line.get_ydata()) for line in entropy.axes[0].lines}
    assert lines["held"] == pytest.approx([h + 0.5 for h in HELD])  # the tracked estimate
    assert lines["grpo"] == pytest.approx(records[0]["entropy"])  # no controller: the rows'
    fig, ax = plt.subplots()
    try:
        targets = {"repo-r": [2.0] * 4, "held": [2.0] * 4, "run#4": [1.5] * 4}
        assert draw_bands(ax, targets) == ["repo-r, held ±25%", "run#4 ±25%"]
        assert len(ax.collections) == 2  # one band per distinct target
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["repo-r, held ±25%", "run#4 ±25%"]
    finally:
        plt.close(fig)
