"""Figure 1 panels from run folders: PNG files, lines per algorithm, cumulative-entropy points."""

from __future__ import annotations

import pytest
from matplotlib import pyplot as plt
from matplotlib.collections import PolyCollection

from entrogym.cli import main as entrogym_main
from entrogym.train.evaluation.plots import (
    accuracy_figure,
    accuracy_vs_entropy_figure,
    entropy_figure,
    load_run,
    plot_runs,
)
from entrogym.train.folder.metrics import MetricsLogger, cumulative_entropy

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(path, algo: str, decay: float, evals: bool = True, iterations: int = 12) -> None:
    """A run folder as the trainer writes it: train rows, and eval rows every 4 iterations."""
    total = 0.0
    with MetricsLogger(path, tensorboard=False) as log:
        if evals:
            log.log({"kind": "eval", "iteration": 0, "algo": algo, "accuracy": 0.1}, step=0)
        for it in range(1, iterations + 1):
            entropy = 1.0 * decay**it
            total += entropy
            row = {"iteration": it, "algo": algo, "entropy": entropy, "cumulative_entropy": total}
            log.log(row, step=it)
            if evals and it % 4 == 0:
                acc = 0.1 + total / 20 + (0.05 if it == 8 else 0.0)
                log.log({"kind": "eval", "iteration": it, "algo": algo, "accuracy": acc}, step=it)


@pytest.fixture
def runs(tmp_path):
    dirs = [tmp_path / "grpo-s0", tmp_path / "grpo-s1", tmp_path / "repo-r-s0"]
    _write_run(dirs[0], "grpo", 0.8)
    _write_run(dirs[1], "grpo", 0.85)
    _write_run(dirs[2], "repo-r", 0.97)
    return dirs


def test_load_run_reads_cumulative_entropy_and_eval_points(runs):
    run = load_run(runs[2])
    assert run.algo == "repo-r"
    assert sorted(run.entropy) == list(range(1, 13))
    assert sorted(run.accuracy) == [0, 4, 8, 12]
    expected = cumulative_entropy(run.entropy[i] for i in range(1, 13))
    assert [run.cumulative[i] for i in range(1, 13)] == pytest.approx(expected)


def test_panels_have_one_line_per_algorithm_and_one_point_per_eval(runs):
    loaded = [load_run(d) for d in runs]
    fig = entropy_figure(loaded)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == [
        "grpo (mean of 2 runs)",
        "repo-r",
    ]
    grpo_mean = ax.get_lines()[0].get_ydata()
    assert grpo_mean[0] == pytest.approx((0.8 + 0.85) / 2)
    assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 1  # the 2-seed band
    plt.close(fig)

    fig = accuracy_figure(loaded)
    assert len(fig.axes[0].get_lines()) == 2
    plt.close(fig)

    fig = accuracy_vs_entropy_figure(loaded)
    scatters = fig.axes[0].collections
    assert len(scatters) == 6  # per run: its checkpoints, and its best one highlighted
    points = scatters[4].get_offsets()  # repo-r: x = cumulative entropy, y = accuracy
    assert len(points) == 4 and points[0][0] == 0.0  # the eval before any training
    assert points[2][0] == pytest.approx(loaded[2].cumulative[8])
    best = scatters[5].get_offsets()
    assert len(best) == 1 and best[0][1] == pytest.approx(max(loaded[2].accuracy.values()))
    plt.close(fig)


def test_plot_runs_writes_the_three_pngs(runs, tmp_path):
    out = tmp_path / "plots"
    paths = plot_runs(runs, out)
    assert [p.name for p in paths] == [
        "entropy.png",
        "accuracy.png",
        "accuracy_vs_cumulative_entropy.png",
        "correlation.json",  # three evaluated runs: enough points for a correlation
    ]
    for p in paths[:3]:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, p
    assert sorted(q.name for q in out.iterdir()) == sorted(p.name for p in paths)  # no temp files


def test_runs_without_eval_rows_get_the_entropy_plot_only(tmp_path, capsys):
    run = tmp_path / "no-eval"
    _write_run(run, "dapo", 0.9, evals=False)
    paths = plot_runs([run], tmp_path / "out")
    assert [p.name for p in paths] == ["entropy.png"]
    assert "need eval rows" in capsys.readouterr().err


def test_cli(runs, tmp_path, capsys):
    assert entrogym_main(["plot", *map(str, runs[:2])]) == 0  # default --out: the first run
    assert (runs[0] / "accuracy_vs_cumulative_entropy.png").stat().st_size > 10_000
    out = tmp_path / "cli-out"
    assert entrogym_main(["plot", str(runs[2]), "--out", str(out), "--metric", "accuracy"]) == 0
    assert (out / "entropy.png").is_file()
    assert entrogym_main(["plot", str(tmp_path / "missing")]) == 2
    assert "metrics.jsonl does not exist" in capsys.readouterr().err


def _write_turns_run(path, algo: str, turns: list[float]) -> None:
    """A multi-turn run's train rows: its per-turn fields as the trainer writes them."""
    with MetricsLogger(path, tensorboard=False) as log:
        for it, mean in enumerate(turns):
            hist = {"1": 2, "2": 3, "3": it + 1}
            log.log({"iteration": it, "algo": algo, "entropy": 1.0 - 0.1 * it,
                     "turns_mean": mean, "turns_max": 3, "turns_hist": hist,
                     "end_reasons": {"done": 4, "max_turns": it + 1, "turn_budget": 1},
                     "tool_calls": 9, "tool_errors": 3 - it % 2,
                     "reward_by_turns": {"1": 0.8, "2": 0.5, "3": 0.1 * it},
                     "entropy_by_turn": {"1": 1.2, "2": 1.0 - 0.1 * it, "3": 0.9}},
                    step=it)  # fmt: skip


def test_multi_turn_runs_get_the_turns_panels(tmp_path):
    from entrogym.train.evaluation.turn_plots import turns_figure

    turn_runs = [tmp_path / "grpo-turns", tmp_path / "repo-r-turns"]
    _write_turns_run(turn_runs[0], "grpo", [2.0, 2.2, 2.5])
    _write_turns_run(turn_runs[1], "repo-r", [1.8, 1.9, 2.0])
    single = tmp_path / "single"
    _write_run(single, "grpo", 0.9, evals=False)
    paths = plot_runs([*turn_runs, single], tmp_path / "out")
    assert [p.name for p in paths] == ["entropy.png", "turns.png"]
    assert paths[1].read_bytes().startswith(PNG_MAGIC)
    loaded = [load_run(d) for d in [*turn_runs, single]]
    fig = turns_figure([(r.algo, r.train_rows) for r in loaded])
    turns, ended, tools, entropy, reward, hist = fig.axes[:6]
    assert [line.get_label() for line in turns.get_lines()] == ["grpo", "repo-r"]  # not single
    assert list(turns.get_lines()[0].get_ydata()) == [2.0, 2.2, 2.5]
    assert len(ended.collections) == 3  # done, max_turns, turn_budget: the reasons that occurred
    # entropy by turn: the first iteration (dashed) and the last, per run
    assert [tuple(line.get_ydata()) for line in entropy.get_lines()][:2] == [
        (1.2, 1.0, 0.9), (1.2, pytest.approx(0.8), 0.9)
    ]  # fmt: skip
    # reward by turn count, weighted by the episodes of each count: 3 turns had 1, 2, 3 episodes
    three = reward.get_lines()[0].get_ydata()[2]
    assert three == pytest.approx((0.0 * 1 + 0.1 * 2 + 0.2 * 3) / 6)
    assert tools.get_lines()[0].get_ydata()[0] == pytest.approx(9 / 6)  # calls per episode
    assert len(hist.patches) == 6  # three turn counts, two runs
    plt.close(fig)
    assert turns_figure([("single", loaded[2].train_rows)]) is None


def test_runs_of_one_algorithm_with_different_settings_are_not_averaged(tmp_path):
    """The held run is GRPO with an entropy constraint: its rows say ``algo: grpo`` too, but
    its saved config's ``algo`` settings differ, so it is a line of its own (named by its folder),
    while two seeds of one configuration are still one averaged line."""
    plain = "algo:\n  name: grpo\n  controller: null\nseed: {seed}\n"
    held = "algo:\n  name: grpo\n  lever: entropy-constraint\n  controller:\n    target: 1.0\nseed: 1\n"
    dirs = [tmp_path / "grpo-s1", tmp_path / "grpo-s2", tmp_path / "held-s1"]
    for d, decay, config in zip(dirs, (0.8, 0.85, 0.99), (plain.format(seed=1),
                                plain.format(seed=2), held), strict=True):  # fmt: skip
        _write_run(d, "grpo", decay)
        (d / "config.yaml").write_text(config)
    loaded = [load_run(d) for d in dirs]
    fig = entropy_figure(loaded)
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["grpo (mean of 2 runs)", "held (grpo)"]
    assert lines[1].get_ydata()[0] == pytest.approx(0.99)  # the held run's own curve
    plt.close(fig)
    fig = accuracy_vs_entropy_figure(loaded)
    labels = [c.get_label() for c in fig.axes[0].collections if not c.get_label().startswith("_")]
    assert labels == ["grpo", "held (grpo)"]
    plt.close(fig)


def test_configurations_named_alike_still_get_lines_of_their_own(tmp_path):
    dirs = [tmp_path / "a" / "grpo", tmp_path / "b" / "grpo"]
    for d, decay, extra in zip(dirs, (0.8, 0.9), ("", "  lever: kl-cov\n"), strict=True):
        _write_run(d, "grpo", decay)
        (d / "config.yaml").write_text(f"algo:\n  name: grpo\n{extra}seed: 0\n")
    fig = entropy_figure([load_run(d) for d in dirs])
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["grpo", "grpo #2"]
    plt.close(fig)
