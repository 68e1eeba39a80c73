"""The bandit lab over a grid of lab and algorithm options: the runs, the table, the heatmaps.

Each cell is a ``LabConfig`` with one run (``entrogym bandit sweep`` reads the grid's text
into them, ``entrogym.commands.bandit_sweep``), run per seed by ``run_one`` and summarised by
the lab's own ``summarize``, so a cell's numbers are the single lab run's numbers. Result
columns are named by the dotted paths of the swept knobs (``lr``, ``algo.controller.kp``).
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entrogym.atomic import atomic_path, atomic_write_text
from entrogym.experiments.lab import run_one
from entrogym.experiments.lab_config import LabConfig, LabRun
from entrogym.experiments.lab_report import TARGET_BAND, summarize

RESULT_COLUMNS = (
    "entropy_ratio",
    "tracking_error",
    "max_excursion",
    "reward_final",
    "cumulative_entropy",
    "clip_frac_low",
    "clip_frac_high",
)


@dataclass(frozen=True)
class SweepCell:
    """One preset at one point of the grid.

    Args:
        algo: the preset (or variant) as the sweep was given it: the table's ``algo`` column.
        knobs: the swept knobs' values in this cell, typed (the table's knob columns).
        lab: the lab that ``entrogym bandit`` would run for it: one run, the sweep's seeds.
    """

    algo: str
    knobs: dict[str, object]
    lab: LabConfig

    @property
    def run(self) -> LabRun:
        return self.lab.algos[0]


def _init_worker() -> None:
    # Tiny tensors: one thread per worker process, the processes use the cores.
    torch.set_num_threads(1)


def _run_task(task: tuple[int, LabRun, int, LabConfig]) -> tuple[int, int, dict, list[dict]]:
    index, run, seed, lab = task
    initial, rows = run_one(run, seed, lab)
    return index, seed, initial, rows


def _mean_metric(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(values)) if values else 0.0


def _run_tasks(tasks: list[tuple[int, LabRun, int, LabConfig]], workers: int) -> list[tuple]:
    if workers <= 1:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return [_run_task(task) for task in tasks]
        finally:
            torch.set_num_threads(threads)
    # spawn, not fork: a forked child of a process that already ran torch ops can hang.
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_init_worker) as pool:
        return pool.map(_run_task, tasks, chunksize=max(1, len(tasks) // (8 * workers)))


def run_sweep(cells: list[SweepCell], workers: int | None = None) -> list[dict[str, Any]]:
    """One result row per cell (``algo``, the swept knobs, ``RESULT_COLUMNS``), run on
    ``workers`` processes (default: every core).

    ``entropy_ratio``, ``tracking_error``, ``max_excursion``, ``reward_final`` and
    ``cumulative_entropy`` are the lab summary's ``entropy_final_ratio``, ``tracking_error``,
    ``max_excursion``, ``reward_final`` and ``cumulative_entropy``; the clip fractions are
    means over iterations and seeds of the share of clipped trajectories.
    """
    tasks = [
        (i, cell.run, seed, cell.lab)
        for i, cell in enumerate(cells)
        for seed in range(cell.lab.seeds)
    ]
    by_run: dict[int, list[tuple]] = {}
    for result in _run_tasks(tasks, workers or os.cpu_count() or 1):
        by_run.setdefault(result[0], []).append(result)
    table = []
    for i, cell in enumerate(cells):
        mine = sorted(by_run[i], key=lambda r: r[1])  # seed order, as the lab runs them
        rows = [row for r in mine for row in r[3]]
        label = cell.run.label
        summary = summarize(rows, {(label, r[1]): r[2] for r in mine}, cell.lab)[label]
        table.append(
            {
                "algo": cell.algo,
                **cell.knobs,
                "entropy_ratio": summary["entropy_final_ratio"],
                "tracking_error": summary["tracking_error"],
                "max_excursion": summary["max_excursion"],
                "reward_final": summary["reward_final"],
                "cumulative_entropy": summary["cumulative_entropy"],
                "clip_frac_low": _mean_metric(rows, "clip_frac_low"),
                "clip_frac_high": _mean_metric(rows, "clip_frac_high"),
            }
        )
    return table


def write_csv(path: Path, table: list[dict[str, Any]]) -> None:
    """``table`` as CSV (columns in the order of the first row), written atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)


def plot_heatmap(table: list[dict[str, Any]], algo: str, axes: tuple[str, ...], path: Path) -> None:
    """``tracking_error`` of ``algo`` over one or two knobs (mean over any other knobs).

    Cells that hold within the target band (``max_excursion`` <= 10 % in every seed over the
    second half) are outlined.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in table if r["algo"] == algo]
    x_knob, y_knob = axes[0], axes[1] if len(axes) > 1 else None
    xs = list(dict.fromkeys(r[x_knob] for r in rows))
    ys = list(dict.fromkeys(r[y_knob] for r in rows)) if y_knob else [None]

    def cell(x: object, y: object, key: str) -> list[float]:
        return [r[key] for r in rows if r[x_knob] == x and (y_knob is None or r[y_knob] == y)]

    error = np.array([[np.mean(cell(x, y, "tracking_error")) for x in xs] for y in ys])
    excursion = np.array([[max(cell(x, y, "max_excursion")) for x in xs] for y in ys])
    fig, ax = plt.subplots(figsize=(1.2 * len(xs) + 2.5, 0.8 * len(ys) + 2.0))
    image = ax.imshow(
        error, cmap="viridis_r", vmin=0.0, vmax=max(0.5, float(error.max())), origin="lower"
    )
    for (yi, xi), value in np.ndenumerate(error):
        ax.text(xi, yi, f"{value:.2f}", ha="center", va="center", color="w", fontsize=8)
        if excursion[yi, xi] <= TARGET_BAND:
            ax.add_patch(plt.Rectangle((xi - 0.5, yi - 0.5), 1, 1, fill=False, ec="red", lw=2))
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_yticks(range(len(ys)), [str(y) for y in ys] if y_knob else [""])
    ax.set(xlabel=x_knob, ylabel=y_knob or "")
    fig.colorbar(image, ax=ax, label="tracking error: mean |H / H_target - 1|, 2nd half")
    ax.set_title(f"{algo} (red = within +-{TARGET_BAND:.0%} at every iteration)", fontsize=9)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100, format="png")
    finally:
        plt.close(fig)


def write_sweep(
    out: Path, table: list[dict[str, Any]], grid: dict[str, list[object]], heatmap: list[str]
) -> list[Path]:
    """``out/sweep.csv``, ``out/sweep.json`` (the grid) and ``out/sweep_<preset>.png``."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "sweep.csv", table)
    atomic_write_text(
        out / "sweep.json", json.dumps({"grid": grid, "rows": table}, indent=1) + "\n"
    )
    swept = [k for k, v in grid.items() if len(v) > 1]
    axes = tuple(heatmap or swept[:2])
    if not axes:  # a single cell: nothing to map
        return []
    paths = []
    for algo in dict.fromkeys(r["algo"] for r in table):
        path = out / f"sweep_{_file_name(algo)}.png"
        plot_heatmap(table, algo, axes, path)
        paths.append(path)
    return paths


def _file_name(algo: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in algo)
