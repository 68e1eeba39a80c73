"""``entrogym bandit sweep``: grid parsing, bad input, and cells equal to single lab runs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from entrogym.commands.bandit_sweep import grid_cells, parse_sweep_args, sweep_cells, sweep_cli
from entrogym.commands.lab_runs import lab_config
from entrogym.experiments.lab import run_lab
from entrogym.experiments.lab_config import LabSettings
from entrogym.experiments.lab_sweep import run_sweep

TINY = LabSettings(iters=6, n_states=4, n_arms=6, samples_per_state=4)


def test_a_cell_gives_the_numbers_of_the_single_lab_run() -> None:
    grid = {"lr": [8.0, 32.0], "algo.controller.max": ["0.5"]}
    table = run_sweep(sweep_cells(["repo-r"], grid, seeds=2, base=TINY), workers=2)
    assert [row["lr"] for row in table] == [8.0, 32.0]
    assert "algo.controller.max" not in table[0]  # given once: fixed, not a column
    label = "repo-r --algo.controller.max 0.5"
    for row in table:
        lab = lab_config([label], **{**TINY.settings(), "seeds": 2, "lr": row["lr"]})
        single = run_lab(lab)[label]
        assert row["entropy_ratio"] == single["entropy_final_ratio"]
        assert row["tracking_error"] == single["tracking_error"]
        assert row["max_excursion"] == single["max_excursion"]
        assert row["reward_final"] == single["reward_final"]
        assert row["cumulative_entropy"] == single["cumulative_entropy"]
    assert table[0]["entropy_ratio"] != table[1]["entropy_ratio"]


def test_grid_values_are_typed_and_crossed() -> None:
    args = parse_sweep_args(
        ["--algos", "adapo,grpo", "--lr", "4,16", "--algo.minibatch-size=none,32", "--seeds", "2"]
    )
    assert args.algos == ["adapo", "grpo"] and args.seeds == 2
    # lab knobs typed at once; algorithm options when their cell is resolved
    assert args.grid == {"lr": [4.0, 16.0], "algo.minibatch_size": ["none", "32"]}
    assert len(grid_cells(args.grid)) == 4
    cells = sweep_cells(["grpo"], {"algo.minibatch_size": ["none", "2"]}, seeds=1, base=TINY)
    table = run_sweep(cells, workers=1)
    assert [row["algo.minibatch_size"] for row in table] == [None, 2]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--algos", "grpo", "--learning_rate", "1,2"], ["learning_rate", "lr", "n_arms"]),
        (
            ["--algos", "repo-r,grpo", "--algo.zeta_max", "0.5"],
            ["algo.zeta_max is not an algorithm option", "--algo.PART.KNOB"],
        ),
        (
            ["--algos", "repo-d,grpo", "--algo.controller", "paper,pi"],
            ["preset 'grpo' has no lever", "presets with a lever: repo-r"],
        ),
        (
            ["--algos", "repo-d", "--algo.controller", "pi", "--algo.controller.kp", "-1"],
            ["algo.controller.kp must be >= 0, got -1"],
        ),
        (["--algos", "grpo", "--lr", ","], ["empty grid", "lr"]),
        (["--algos", "grpo"], ["empty grid"]),
        (["--algos", "ppo2", "--lr", "1"], ["ppo2", "repo-r"]),
        (["--algos", "grpo", "--algo.epochs", "two"], ["epochs", "two"]),
        (["--algos", "grpo", "--lr", "-1,2"], ["lr must be > 0"]),
        (["--algos", "grpo", "--lr", "1", "--seeds", "x"], ["seeds"]),
    ],
)
def test_bad_input_names_the_valid_choices(argv: list[str], words: list[str], capsys) -> None:
    assert sweep_cli([*argv, "--out", "/nonexistent/x"]) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, (word, err)


def test_cli_writes_table_and_heatmaps(tmp_path: Path, capsys) -> None:
    argv = ["--algos", "repo-r,repo-d", "--algo.controller.max", "0.05,0.5", "--lr", "8,16"]
    tiny = ["--iters", "4", "--n_states", "3", "--n_arms", "4", "--samples_per_state", "3"]
    assert sweep_cli([*argv, *tiny, "--seeds", "1", "--workers", "1", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8
    assert list(rows[0])[:3] == ["algo", "algo.controller.max", "lr"]
    assert {"entropy_ratio", "tracking_error", "max_excursion", "reward_final"} <= set(rows[0])
    assert all(0 < float(r["entropy_ratio"]) < 3 for r in rows)
    for algo in ("repo-r", "repo-d"):
        assert (tmp_path / f"sweep_{algo}.png").stat().st_size > 1000
    assert "sweep.csv" in capsys.readouterr().out


def test_entrogym_bandit_sweep_reaches_the_sweep(tmp_path: Path, capsys) -> None:
    from entrogym.commands import bandit

    assert "entrogym bandit sweep" in bandit.build_parser().format_help()
    tiny = ["--iters", "4", "--n-states", "3", "--n-arms", "4", "--samples-per-state", "3"]
    argv = ["sweep", "--algos", "repo-d", "--lr", "4,16", "--algo.controller", "paper,pi"]
    assert bandit.cli([*argv, *tiny, "--seeds", "1", "--workers", "1", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["lr"], r["algo.controller"]) for r in rows] == [
        ("4.0", "paper"), ("4.0", "pi"), ("16.0", "paper"), ("16.0", "pi"),
    ]  # fmt: skip
    assert all(float(r["tracking_error"]) >= 0 for r in rows)
    assert bandit.cli(["sweep", "--algos", "grpo", "--algo.lever.centering", "exact"]) == 2
    assert "presets with a lever: repo-r, repo-d" in capsys.readouterr().err
