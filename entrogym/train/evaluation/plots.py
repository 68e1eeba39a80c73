"""The paper's Figure 1 panels from run folders: ``entrogym plot RUN [RUN ...] --out DIR``.

* ``entropy.png``: mean token entropy against iteration, one line per configuration; runs with
  the same ``algo`` settings in their ``config.yaml`` (several seeds) are averaged, with a
  min-max band. An algorithm run with other settings (GRPO with an entropy constraint beside
  plain GRPO) is a line of its own, named by its folder (without a ``-sN`` seed suffix).
* ``accuracy.png``: eval accuracy against iteration, the same way.
* ``accuracy_vs_cumulative_entropy.png``: one point per eval row of every run, x = cumulative
  entropy up to that iteration, y = accuracy; each run's best point is highlighted.
* ``correlation.json``: Pearson's and Spearman's correlation of each run's final accuracy with
  its cumulative entropy (:mod:`entrogym.train.evaluation.correlation`), also printed.
* ``turns.png``: for multi-turn runs, their per-turn metrics
  (:mod:`entrogym.train.evaluation.turn_plots`).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI

from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from entrogym.atomic import atomic_path, atomic_write_text  # noqa: E402
from entrogym.train.evaluation.correlation import Correlation, correlation_of  # noqa: E402
from entrogym.train.evaluation.turn_plots import turns_figure  # noqa: E402
from entrogym.train.folder.layout import folder_label, saved_config  # noqa: E402
from entrogym.train.folder.metrics import cumulative_entropy, read_metrics  # noqa: E402

# Eval-row fields tried in order when no metric is named: the share of tasks solved.
ACCURACY_FIELDS = ("accuracy", "success_rate", "tgc", "pass@1")


@dataclass
class Run:
    """One run folder's metrics, split into what the panels need."""

    path: Path
    algo: str
    # the saved config's ``algo`` settings, as canonical JSON: runs alike but for the seed
    # share it, so they are averaged into one line
    settings: str = ""
    entropy: dict[int, float] = field(default_factory=dict)  # iteration -> mean entropy
    cumulative: dict[int, float] = field(default_factory=dict)  # iteration -> cumulative
    accuracy: dict[int, float] = field(default_factory=dict)  # iteration -> eval accuracy
    train_rows: list[dict[str, Any]] = field(default_factory=list)  # one per iteration, in order


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def load_run(
    run_dir: str | os.PathLike[str], *, metric: str | None = None, split: str | None = None
) -> Run:
    """Read ``RUN/metrics.jsonl`` into a :class:`Run` (eval rows of ``split`` only, if given)."""
    path = Path(run_dir)
    rows = read_metrics(path)
    algo = next((str(r["algo"]) for r in rows if r.get("algo")), path.name)
    settings = json.dumps(saved_config(path).get("algo"), sort_keys=True, default=str)
    run = Run(path=path, algo=algo, settings=settings)
    train = _last_row_per_iteration(
        path, [(n, r) for n, r in enumerate(rows, start=1) if r.get("kind", "train") == "train"]
    )
    run.train_rows = train
    train = [r for r in train if _finite(r.get("entropy"))]
    for r in train:
        run.entropy[int(r["iteration"])] = float(r["entropy"])
    sums = cumulative_entropy(run.entropy.values())
    for r, computed in zip(train, sums, strict=True):
        given = r.get("cumulative_entropy")
        run.cumulative[int(r["iteration"])] = float(given) if _finite(given) else computed
    evals = [r for r in rows if r.get("kind") == "eval"]
    for n, r in enumerate(rows, start=1):
        if r.get("kind") == "eval":
            _iteration(path, n, r)  # every eval row names its iteration
    if split is None:
        splits = list(dict.fromkeys(r["split"] for r in evals if "split" in r))
        if len(splits) > 1:
            print(f"{path}: eval rows of splits {splits}; plotting {splits[0]!r} (--split)")
        split = splits[0] if splits else None
    for r in evals:
        if split is not None and r.get("split", split) != split:
            continue
        names = (metric,) if metric else ACCURACY_FIELDS
        value = next((r[n] for n in names if _finite(r.get(n))), None)
        if value is not None:
            run.accuracy[int(r["iteration"])] = float(value)
    return run


def _iteration(path: Path, line: int, row: dict[str, Any]) -> int:
    """The row's iteration; a ValueError naming the line when it has none."""
    it = row.get("iteration")
    if isinstance(it, bool) or not isinstance(it, int):
        raise ValueError(
            f"{path / 'metrics.jsonl'}: line {line} has no integer iteration ({it!r}); "
            "remove or fix that line"
        )
    return it


def _last_row_per_iteration(path: Path, numbered: list[tuple[int, dict[str, Any]]]) -> list:
    """Train rows in iteration order, one per iteration: the last one written (a file may
    hold repeats, e.g. concatenated from two runs); each repeat is reported on stderr."""
    lines: dict[int, list[int]] = defaultdict(list)
    last: dict[int, dict[str, Any]] = {}
    for line, row in numbered:
        it = _iteration(path, line, row)
        lines[it].append(line)
        last[it] = row
    for it, where in sorted(lines.items()):
        if len(where) > 1:
            print(
                f"{path / 'metrics.jsonl'}: iteration {it} has {len(where)} train rows (lines "
                f"{', '.join(map(str, where))}); plotting the last",
                file=sys.stderr,
            )
    return [last[it] for it in sorted(last)]


def cumulative_at(run: Run, iteration: int) -> float:
    """Cumulative entropy up to ``iteration`` (0 before the first training iteration)."""
    before = [it for it in run.cumulative if it <= iteration]
    return run.cumulative[max(before)] if before else 0.0


def line_labels(runs: list[Run]) -> dict[Path, str]:
    """Each run's line: its algorithm's name, or, where runs of one algorithm differ in their
    settings, ``LABEL (algo)`` with LABEL the folder's name without a ``-sN`` seed suffix (the
    first run's of each configuration); ``#N`` tells apart configurations named alike."""
    first: dict[tuple[str, str], Path] = {}
    for run in runs:
        first.setdefault((run.algo, run.settings), run.path)
    kinds = Counter(algo for algo, _ in first)
    names: dict[tuple[str, str], str] = {}
    for (algo, settings), path in first.items():
        label = folder_label(path)
        name = algo if kinds[algo] == 1 or label == algo else f"{label} ({algo})"
        taken = sum(n == name or n.startswith(f"{name} #") for n in names.values())
        names[algo, settings] = f"{name} #{taken + 1}" if taken else name
    return {run.path: names[run.algo, run.settings] for run in runs}


def _grouped(runs: list[Run], attr: str) -> dict[str, list[dict[int, float]]]:
    labels = line_labels(runs)
    groups: dict[str, list[dict[int, float]]] = defaultdict(list)
    for run in runs:
        series = getattr(run, attr)
        if series:
            groups[labels[run.path]].append(series)
    return groups


def _curve_figure(runs: list[Run], attr: str, ylabel: str, title: str) -> Figure:
    """One line per configuration (mean over its runs) with a min-max band where it has
    several."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for algo, series in _grouped(runs, attr).items():
        iterations = sorted(set().union(*series))
        per_it = [[s[it] for s in series if it in s] for it in iterations]
        mean = [sum(v) / len(v) for v in per_it]
        label = algo if len(series) == 1 else f"{algo} (mean of {len(series)} runs)"
        (line,) = ax.plot(iterations, mean, label=label)
        if len(series) > 1:
            ax.fill_between(
                iterations,
                [min(v) for v in per_it],
                [max(v) for v in per_it],
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
            )
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def entropy_figure(runs: list[Run]) -> Figure:
    """Figure 1 (top row, entropy): mean token entropy over training iterations."""
    return _curve_figure(runs, "entropy", "mean token entropy (nats)", "Entropy during training")


def accuracy_figure(runs: list[Run]) -> Figure:
    """Figure 1 (top row, accuracy): test accuracy over training iterations."""
    return _curve_figure(runs, "accuracy", "test accuracy", "Test accuracy during training")


def accuracy_vs_entropy_figure(runs: list[Run]) -> Figure:
    """Figure 1 (bottom row): accuracy of each checkpoint against the cumulative entropy up to
    it; one scatter per run, coloured by configuration, best checkpoint per run highlighted."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    colors: dict[str, str] = {}
    labelled: set[str] = set()
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lines = line_labels(runs)
    for run in runs:
        if not run.accuracy:
            continue
        name = lines[run.path]
        color = colors.setdefault(name, cycle[len(colors) % len(cycle)])
        its = sorted(run.accuracy)
        xs = [cumulative_at(run, it) for it in its]
        ys = [run.accuracy[it] for it in its]
        label = None if name in labelled else name
        labelled.add(name)
        ax.scatter(xs, ys, color=color, s=18, alpha=0.6, label=label)
        best = max(range(len(ys)), key=lambda i: (ys[i], -its[i]))
        ax.scatter(
            [xs[best]], [ys[best]], color=color, s=90, marker="*", edgecolors="black", zorder=3
        )
    ax.set_xlabel("cumulative entropy up to the checkpoint")
    ax.set_ylabel("test accuracy")
    ax.set_title("Accuracy vs cumulative entropy (best checkpoint per run: star)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def accuracy_entropy_correlation(runs: list[Run]) -> Correlation | None:
    """Each run's last evaluated accuracy against its cumulative entropy up to that checkpoint
    (:func:`entrogym.train.evaluation.correlation.correlation_of`); None with fewer than 3 such runs."""
    points = []
    for run in runs:
        if run.accuracy:
            last = max(run.accuracy)
            points.append((str(run.path), cumulative_at(run, last), run.accuracy[last]))
    return correlation_of(points)


def _save(fig: Figure, path: Path) -> Path:
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120)
    finally:
        plt.close(fig)
    return path


def plot_runs(
    run_dirs: list[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    metric: str | None = None,
    split: str | None = None,
) -> list[Path]:
    """Draw the Figure 1 panels for ``run_dirs`` into ``out_dir``; returns the PNGs written."""
    if not run_dirs:
        raise ValueError("plot_runs: give at least one run folder")
    runs = [load_run(d, metric=metric, split=split) for d in run_dirs]
    if not any(r.entropy for r in runs):
        raise ValueError(
            f"no train rows with an 'entropy' field in {[str(r.path) for r in runs]}; "
            "these do not look like entrogym run folders"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [_save(entropy_figure(runs), out / "entropy.png")]
    turns = turns_figure([(f"{r.algo} ({r.path.name})", r.train_rows) for r in runs])
    if turns is not None:
        written.append(_save(turns, out / "turns.png"))
    without = [str(r.path) for r in runs if not r.accuracy]
    if len(without) == len(runs):
        fields = metric or " / ".join(ACCURACY_FIELDS)
        print(
            'accuracy panels skipped: they need eval rows ("kind": "eval" with '
            f"{fields}) in metrics.jsonl, and none of {without} has any. Train with "
            "evaluation enabled to get them.",
            file=sys.stderr,
        )
        return written
    if without:
        print(f"no eval rows in {without}: left out of the accuracy panels", file=sys.stderr)
    written.append(_save(accuracy_figure(runs), out / "accuracy.png"))
    written.append(
        _save(accuracy_vs_entropy_figure(runs), out / "accuracy_vs_cumulative_entropy.png")
    )
    corr = accuracy_entropy_correlation(runs)
    if corr is not None:
        print(corr.line())
        atomic_write_text(out / "correlation.json", json.dumps(asdict(corr), indent=1) + "\n")
        written.append(out / "correlation.json")
    return written
