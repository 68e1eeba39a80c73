"""``entrogym bandit sweep``: the bandit lab over a grid of lab and algorithm options.

Options are named as on the command line: lab knobs are ``LabConfig`` fields (``lr``,
``n_arms``, ``calibration``, ``iters``, ...), algorithm options are the ``--algo`` paths
(``algo.controller``, ``algo.controller.kp``, ``algo.lever.centering``, ``algo.epochs``). Each
grid cell of each preset runs ``run_one`` per seed with exactly the ``LabConfig`` and labelled
variant (``"repo-d --algo.controller pi"``) that ``entrogym bandit`` would use, and is
summarised by the lab's own ``summarize``, so a cell's numbers are the single lab run's numbers.
Result columns are named by these dotted paths.
"""

from __future__ import annotations

import csv
import itertools
import json
import multiprocessing
import os
import shlex
import sys
import time
import typing
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entrogym.atomic import atomic_path, atomic_write_text
from entrogym.theory.lab import LabConfig, entry_label, run_one
from entrogym.theory.lab_report import TARGET_BAND, summarize
from entrogym.train.algo_spec import algo_args_mapping, convert_text, parse_label, typed_spec

ALGO_PREFIX = "algo."
# Chosen per sweep rather than per cell: presets, seeds and lab-wide algo options are the
# sweep's own.
LAB_KNOBS = tuple(f.name for f in fields(LabConfig) if f.name not in ("algos", "seeds", "algo"))
RESULT_COLUMNS = (
    "entropy_ratio",
    "tracking_error",
    "max_excursion",
    "reward_final",
    "cumulative_entropy",
    "clip_frac_low",
    "clip_frac_high",
)


def knob_name(option: str) -> str:
    """``--algo.controller.target-unit`` -> ``algo.controller.target_unit``; ``--n-arms`` ->
    ``n_arms`` (the column names)."""
    return option.lstrip("-").replace("-", "_")


def parse_grid_value(knob: str, text: str) -> object:
    """One grid value: a lab knob typed as its LabConfig field; an algorithm option's value
    stays text until its cell is resolved (its type depends on the part the cell uses)."""
    if knob.startswith(ALGO_PREFIX):
        return text.strip()
    return convert_text(knob, text, typing.get_type_hints(LabConfig)[knob])


def check_knob(knob: str) -> None:
    """``knob`` is a lab knob or an algorithm option path (ValueError naming the valid ones)."""
    if knob.startswith(ALGO_PREFIX):
        algo_args_mapping([f"--{knob}=x"])  # raises on a path that is no algorithm option
    elif knob not in LAB_KNOBS:
        raise ValueError(
            f"unknown knob {knob!r}; lab knobs: {', '.join(LAB_KNOBS)}; algorithm options: "
            "algo.epochs, algo.minibatch_size, algo.PART, algo.PART.KNOB (parts: advantage, "
            "loss, mask, lever, controller)"
        )


def check_grid(algos: list[str], grid: dict[str, list[object]]) -> None:
    """Reject empty lists, unknown knobs (naming the valid ones) and empty grids; every cell's
    algorithm is resolved by ``cell_run``, which names what a preset does not accept."""
    if not algos:
        raise ValueError("algos: empty list; give presets, e.g. --algos repo-r,grpo")
    if not grid:
        raise ValueError("empty grid: give at least one knob with values, e.g. --lr 4,16")
    for knob, values in grid.items():
        check_knob(knob)
        if not values:
            raise ValueError(f"empty grid: knob {knob!r} has no values; give e.g. 1,2")


def grid_cells(grid: dict[str, list[object]]) -> list[dict[str, object]]:
    """The cartesian product of the grid, in command-line order."""
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


def cell_entry(algo: str, cell: dict[str, object]) -> str:
    """The lab entry of one cell: ``algo`` followed by the cell's algorithm options."""
    words = []
    for knob, value in cell.items():
        if knob.startswith(ALGO_PREFIX):
            words.append(f"--{knob}={'none' if value is None else value}")
    return f"{algo} {shlex.join(words)}".strip()


def cell_run(
    algo: str, cell: dict[str, object], base: LabConfig, seeds: int
) -> tuple[str, LabConfig]:
    """The label and LabConfig that ``entrogym bandit`` would run for this cell."""
    entry = cell_entry(algo, cell)
    lab_knobs = {k: v for k, v in cell.items() if not k.startswith(ALGO_PREFIX)}
    lab = replace(base, algos=[entry], seeds=seeds, **lab_knobs)
    lab.validate()
    return entry_label(entry), lab


def cell_values(algo: str, cell: dict[str, object], lab: LabConfig) -> dict[str, object]:
    """The cell's knobs with typed values (an algorithm option as its part reads it)."""
    spec = typed_spec(lab.spec(lab.algos[0]))
    out = {}
    for knob, value in cell.items():
        if knob.startswith(ALGO_PREFIX):
            path = knob[len(ALGO_PREFIX) :].split(".")
            value = spec[path[0]] if len(path) == 1 else spec[path[0]][path[1]]
            if isinstance(value, dict):  # a part named by the cell: its name
                value = value["name"]
        out[knob] = value
    return out


def _init_worker() -> None:
    # Tiny tensors: one thread per worker process, the processes use the cores.
    torch.set_num_threads(1)


def _run_task(task: tuple[int, str, int, LabConfig]) -> tuple[int, int, dict, list[dict]]:
    index, label, seed, lab = task
    initial, rows = run_one(label, seed, lab)
    return index, seed, initial, rows


def _mean_metric(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(values)) if values else 0.0


def _run_tasks(tasks: list[tuple[int, str, int, LabConfig]], workers: int) -> list[tuple]:
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


def run_sweep(
    algos: list[str],
    grid: dict[str, list[object]],
    *,
    seeds: int = 3,
    base: LabConfig | None = None,
    workers: int | None = None,
) -> list[dict[str, Any]]:
    """One result row per preset and grid cell (``algo``, the swept knobs, ``RESULT_COLUMNS``).

    ``grid`` maps knob names (``"lr"``, ``"algo.controller"``, ``"algo.controller.kp"``) to
    lists of values; every other setting comes from ``base`` (``LabConfig()`` by default). Runs
    on ``workers`` processes (default: every core). ``entropy_ratio``, ``tracking_error``,
    ``max_excursion``, ``reward_final`` and ``cumulative_entropy`` are the lab summary's
    ``entropy_final_ratio``, ``tracking_error``, ``max_excursion``, ``reward_final`` and
    ``cumulative_entropy``; the clip fractions are means over iterations and seeds of the
    share of clipped trajectories.
    """
    check_grid(algos, grid)
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    base = base or LabConfig()
    # Columns only for swept knobs; a knob with one value is fixed (sweep.json records it).
    swept = [k for k, v in grid.items() if len(v) > 1]
    runs = [
        (algo, cell, *cell_run(algo, cell, base, seeds))
        for algo in algos
        for cell in grid_cells(grid)
    ]
    tasks = [
        (i, label, seed, lab) for i, (_, _, label, lab) in enumerate(runs) for seed in range(seeds)
    ]
    by_run: dict[int, list[tuple]] = {}
    for result in _run_tasks(tasks, workers or os.cpu_count() or 1):
        by_run.setdefault(result[0], []).append(result)
    table = []
    for i, (algo, cell, label, lab) in enumerate(runs):
        mine = sorted(by_run[i], key=lambda r: r[1])  # seed order, as the lab runs them
        rows = [row for r in mine for row in r[3]]
        summary = summarize(rows, {(label, r[1]): r[2] for r in mine}, lab)[label]
        values = cell_values(algo, cell, lab)
        table.append(
            {
                "algo": algo,
                **{k: v for k, v in values.items() if k in swept},
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


USAGE = """usage: entrogym bandit sweep --algos PRESET[,PRESET...] [--KNOB V1,V2,...]... [--seeds N]
                             [--out DIR] [--heatmap KNOB_X,KNOB_Y] [--workers N]

Runs the bandit lab over the grid of the given knobs (a knob given one value is fixed) and
writes DIR/sweep.csv, DIR/sweep.json and DIR/sweep_<preset>.png (tracking error over two
knobs, by default the first two swept ones; cells within +-10 % of the target at every
iteration of the second half outlined). Lab knobs: {lab}. Algorithm options: --algo.epochs,
--algo.minibatch-size, --algo.PART NAME and --algo.PART.KNOB (parts: advantage, loss, mask,
lever, controller; `entrogym train --help` lists every part and knob). Example:
  entrogym bandit sweep --algos repo-d --algo.controller paper,pi --lr 4,16 --iters 200 --seeds 2
"""


@dataclass
class SweepArgs:
    """The parsed command line of ``entrogym bandit sweep``."""

    algos: list[str]
    grid: dict[str, list[object]]
    seeds: int = 3
    out: Path = Path("runs/bandit-sweep")
    heatmap: list[str] | None = None
    workers: int | None = None


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_sweep_args(argv: list[str]) -> SweepArgs:
    """``--name value`` / ``--name=value`` pairs; grid knobs take comma-separated values.
    Dashes in a name read as underscores (``--n-arms`` is ``n_arms``)."""
    options: dict[str, str] = {}
    tokens = list(argv)
    while tokens:
        token = tokens.pop(0)
        if not token.startswith("--") or token == "--":
            raise ValueError(f"unexpected argument {token!r}; options look like --lr 4,16")
        name, sep, value = token[2:].partition("=")
        name = knob_name(name)  # --n-arms / --algo.controller.target-unit, as elsewhere
        if not sep:
            if not tokens:
                raise ValueError(f"--{name} needs a value")
            value = tokens.pop(0)
        options[name] = value
    if "algos" not in options:
        raise ValueError("--algos is required, e.g. --algos repo-r,grpo")
    algos = _split(options.pop("algos"))
    args = SweepArgs(algos=algos, grid={})
    if "seeds" in options:
        args.seeds = int(convert_text("seeds", options.pop("seeds"), int))
    if "out" in options:
        args.out = Path(options.pop("out"))
    if "heatmap" in options:
        args.heatmap = [k.replace("-", "_") for k in _split(options.pop("heatmap"))]
    if "workers" in options:
        args.workers = int(convert_text("workers", options.pop("workers"), int))
    check_grid(algos, {k: [None] for k in options})  # names first, before reading values
    args.grid = {k: [parse_grid_value(k, v) for v in _split(text)] for k, text in options.items()}
    check_grid(algos, args.grid)
    for algo in algos:  # every cell resolves before anything runs (one line naming the problem)
        parse_label(algo)
        for cell in grid_cells(args.grid):
            cell_run(algo, cell, LabConfig(), args.seeds)
    swept = [k for k, v in args.grid.items() if len(v) > 1]
    if args.heatmap and (not 1 <= len(args.heatmap) <= 2 or set(args.heatmap) - set(swept)):
        raise ValueError(
            f"--heatmap takes one or two swept knobs; swept: {', '.join(swept) or 'none'}"
        )
    return args


def sweep_cli(argv: list[str], prog: str = "entrogym bandit sweep") -> int:
    """Parse ``argv``, run the sweep with a progress line, write the outputs, print the table."""
    if {"-h", "--help"} & set(argv):
        print(USAGE.format(lab=", ".join(LAB_KNOBS)))
        return 0
    try:
        args = parse_sweep_args(argv)
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    cells = len(grid_cells(args.grid)) * len(args.algos)
    print(f"bandit sweep: {cells} cells x {args.seeds} seeds", flush=True)
    start = time.perf_counter()
    try:  # every cell's settings are checked before the first run starts
        table = run_sweep(args.algos, args.grid, seeds=args.seeds, workers=args.workers)
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start
    paths = write_sweep(args.out, table, args.grid, args.heatmap or [])
    keys = list(table[0])
    print("  ".join(f"{k:>14}" for k in keys))
    for row in table:
        print(
            "  ".join(f"{v:>14.3f}" if isinstance(v, float) else f"{v!s:>14}" for v in row.values())
        )
    written = [args.out / "sweep.csv", args.out / "sweep.json", *paths]
    print(f"{elapsed:.0f}s; wrote {', '.join(str(p) for p in written)}")
    return 0


if __name__ == "__main__":  # python -m entrogym.theory.sweep ... (spawned workers skip this)
    sys.exit(sweep_cli(sys.argv[1:]))
