"""``entrogym bandit sweep``: the bandit lab over a grid of lab and preset knobs.

Knobs are named as on the command line: lab knobs are ``LabConfig`` fields (``lr``, ``n_arms``,
``calibration``, ``iters``, ...), preset knobs are ``algo.<field>`` (``algo.zeta_max``,
``algo.eps_high_max``, ``algo.epochs``, ``algo.minibatch_size``). Each grid cell of each preset
runs ``run_one`` per seed with exactly the ``LabConfig`` and labelled variant
(``"repo-r (zeta_max=0.5)"``) that ``entrogym bandit`` would use, and is summarised by the lab's
own ``summarize``, so a cell's numbers are the single lab run's numbers.
"""

from __future__ import annotations

import csv
import itertools
import json
import multiprocessing
import os
import sys
import time
import typing
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entrogym.algos.presets import preset_knobs, presets_with
from entrogym.atomic import atomic_path, atomic_write_text
from entrogym.theory.lab import LabConfig, run_one
from entrogym.theory.lab_report import HOLD_TOLERANCE, summarize
from entrogym.theory.variants import convert, parse_knob_value, variant_label

ALGO_PREFIX = "algo."
# Chosen per sweep rather than per cell: presets and seeds are the sweep's own options.
LAB_KNOBS = tuple(f.name for f in fields(LabConfig) if f.name not in ("algos", "seeds"))
RESULT_COLUMNS = (
    "entropy_ratio",
    "reward_final",
    "cumulative_entropy",
    "clip_frac_low",
    "clip_frac_high",
)


def valid_knobs(algo: str) -> list[str]:
    """Every knob the sweep accepts for preset ``algo``, named as on the command line."""
    return [*LAB_KNOBS, *(ALGO_PREFIX + k for k in preset_knobs(algo))]


def parse_grid_value(knob: str, text: str) -> object:
    """One grid value of ``knob`` with the type of its LabConfig / AlgorithmConfig field."""
    if knob.startswith(ALGO_PREFIX):
        return parse_knob_value(knob[len(ALGO_PREFIX) :], text)
    return convert(knob, text, typing.get_type_hints(LabConfig)[knob])


def check_grid(algos: list[str], grid: dict[str, list[object]]) -> None:
    """Reject unknown presets, unknown or inapplicable knobs (naming the valid ones) and
    empty grids (no knob, or a knob without values)."""
    if not algos:
        raise ValueError("algos: empty list; give presets, e.g. --algos repo-r,grpo")
    if not grid:
        raise ValueError("empty grid: give at least one knob with values, e.g. --lr 4,16")
    for algo in algos:
        valid = valid_knobs(algo)  # raises on an unknown preset
        for knob, values in grid.items():
            if knob not in valid:
                accepting = (
                    presets_with(knob[len(ALGO_PREFIX) :]) if knob.startswith(ALGO_PREFIX) else []
                )
                where = f"presets that accept it: {', '.join(accepting)}; " if accepting else ""
                raise ValueError(
                    f"knob {knob!r} does not apply to preset {algo!r}; {where}"
                    f"its knobs: {', '.join(valid)}"
                )
            if not values:
                raise ValueError(f"empty grid: knob {knob!r} has no values; give e.g. 1,2")


def grid_cells(grid: dict[str, list[object]]) -> list[dict[str, object]]:
    """The cartesian product of the grid, in command-line order."""
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


def cell_run(
    algo: str, cell: dict[str, object], base: LabConfig, seeds: int
) -> tuple[str, LabConfig]:
    """The variant label and LabConfig that ``entrogym bandit`` would run for this cell."""
    overrides = {k[len(ALGO_PREFIX) :]: v for k, v in cell.items() if k.startswith(ALGO_PREFIX)}
    label = variant_label(algo, overrides)
    lab_knobs = {k: v for k, v in cell.items() if not k.startswith(ALGO_PREFIX)}
    lab = replace(base, algos=[label], seeds=seeds, **lab_knobs)
    lab.validate()
    return label, lab


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

    ``grid`` maps knob names (``"lr"``, ``"algo.zeta_max"``) to lists of typed values; every
    other setting comes from ``base`` (``LabConfig()`` by default). Runs on ``workers``
    processes (default: every core). ``entropy_ratio``, ``reward_final`` and
    ``cumulative_entropy`` are the lab summary's ``entropy_final_ratio``, ``reward_final`` and
    ``cumulative_entropy`` (means over seeds); the clip fractions are means over iterations and
    seeds of the share of clipped trajectories.
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
        table.append(
            {
                "algo": algo,
                **{k: v for k, v in cell.items() if k in swept},
                "entropy_ratio": summary["entropy_final_ratio"],
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
    """Final/initial entropy of ``algo`` over one or two knobs (mean over any other knobs).

    Cells within the lab's hold tolerance (final within 25 % of initial) are outlined.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in table if r["algo"] == algo]
    x_knob, y_knob = axes[0], axes[1] if len(axes) > 1 else None
    xs = list(dict.fromkeys(r[x_knob] for r in rows))
    ys = list(dict.fromkeys(r[y_knob] for r in rows)) if y_knob else [None]
    grid = np.array(
        [
            [
                np.mean(
                    [
                        r["entropy_ratio"]
                        for r in rows
                        if r[x_knob] == x and (y_knob is None or r[y_knob] == y)
                    ]
                )
                for x in xs
            ]
            for y in ys
        ]
    )
    fig, ax = plt.subplots(figsize=(1.2 * len(xs) + 2.5, 0.8 * len(ys) + 2.0))
    image = ax.imshow(
        grid, cmap="viridis", vmin=0.0, vmax=max(1.5, float(grid.max())), origin="lower"
    )
    for (yi, xi), value in np.ndenumerate(grid):
        ax.text(xi, yi, f"{value:.2f}", ha="center", va="center", color="w", fontsize=8)
        if abs(value - 1.0) <= HOLD_TOLERANCE:
            ax.add_patch(plt.Rectangle((xi - 0.5, yi - 0.5), 1, 1, fill=False, ec="red", lw=2))
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_yticks(range(len(ys)), [str(y) for y in ys] if y_knob else [""])
    ax.set(xlabel=x_knob, ylabel=y_knob or "")
    fig.colorbar(image, ax=ax, label="final / initial exact entropy")
    ax.set_title(f"{algo}: entropy kept (red = within {HOLD_TOLERANCE:.0%})", fontsize=9)
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
        path = out / f"sweep_{algo}.png"
        plot_heatmap(table, algo, axes, path)
        paths.append(path)
    return paths


USAGE = """usage: entrogym bandit sweep --algos PRESET[,PRESET...] [--KNOB V1,V2,...]... [--seeds N]
                             [--out DIR] [--heatmap KNOB_X,KNOB_Y] [--workers N]

Runs the bandit lab over the grid of the given knobs (a knob given one value is fixed) and
writes DIR/sweep.csv, DIR/sweep.json and DIR/sweep_<preset>.png (final/initial entropy over
two knobs, by default the first two swept ones). Lab knobs: {lab}. Preset knobs: algo.<knob>
for the preset's knobs, e.g. algo.zeta_max, algo.eps_high_max, algo.epochs,
algo.minibatch_size, algo.repo_centering (raw,exact; repo-r and repo-d). Example:
  entrogym bandit sweep --algos repo-r --lr 4,16 --algo.zeta_max 0.05,0.5 --iters 100 --seeds 2
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
        name = name.replace(
            "-", "_"
        )  # --n-arms / --algo.zeta-max, as the other commands spell them
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
        args.seeds = int(convert("seeds", options.pop("seeds"), int))
    if "out" in options:
        args.out = Path(options.pop("out"))
    if "heatmap" in options:
        args.heatmap = [k.replace("-", "_") for k in _split(options.pop("heatmap"))]
    if "workers" in options:
        args.workers = int(convert("workers", options.pop("workers"), int))
    check_grid(algos, {k: [None] for k in options})  # names first, before reading values
    args.grid = {k: [parse_grid_value(k, v) for v in _split(text)] for k, text in options.items()}
    check_grid(algos, args.grid)
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
