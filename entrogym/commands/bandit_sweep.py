"""``entrogym bandit sweep``: the grid's text read into the lab's cells, then run and shown.

Options are named as on the command line: lab knobs are ``LabSettings`` fields (``lr``,
``n_arms``, ``calibration``, ``iters``, ...), algorithm options are the ``--algo`` paths
(``algo.controller``, ``algo.controller.kp``, ``algo.lever.centering``, ``algo.epochs``). Each
grid cell of each preset becomes exactly the ``LabConfig`` and labelled variant
(``"repo-d --algo.controller pi"``) that ``entrogym bandit`` would run
(``entrogym.experiments.lab_sweep`` runs them).
"""

from __future__ import annotations

import itertools
import shlex
import sys
import time
import typing
from dataclasses import dataclass, fields
from pathlib import Path

from entrogym.commands.algo_text import algo_args_mapping, convert_text, typed_spec
from entrogym.commands.lab_runs import entry_spec, lab_runs
from entrogym.experiments.lab_config import LabConfig, LabSettings
from entrogym.experiments.lab_sweep import SweepCell, run_sweep, write_sweep

ALGO_PREFIX = "algo."
# Chosen per sweep rather than per cell: the seeds are the sweep's own.
LAB_KNOBS = tuple(f.name for f in fields(LabSettings) if f.name != "seeds")


def knob_name(option: str) -> str:
    """``--algo.controller.target-unit`` -> ``algo.controller.target_unit``; ``--n-arms`` ->
    ``n_arms`` (the column names)."""
    return option.lstrip("-").replace("-", "_")


def parse_grid_value(knob: str, text: str) -> object:
    """One grid value: a lab knob typed as its LabSettings field; an algorithm option's value
    stays text until its cell is resolved (its type depends on the part the cell uses)."""
    if knob.startswith(ALGO_PREFIX):
        return text.strip()
    return convert_text(knob, text, typing.get_type_hints(LabSettings)[knob])


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
    algorithm is resolved by ``sweep_cell``, which names what a preset does not accept."""
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


def cell_values(entry: str, cell: dict[str, object]) -> dict[str, object]:
    """The cell's knobs with typed values (an algorithm option as its part reads it)."""
    spec = typed_spec(entry_spec(entry))
    out = {}
    for knob, value in cell.items():
        if knob.startswith(ALGO_PREFIX):
            path = knob[len(ALGO_PREFIX) :].split(".")
            value = spec[path[0]] if len(path) == 1 else spec[path[0]][path[1]]
            if isinstance(value, dict):  # a part named by the cell: its name
                value = value["name"]
        out[knob] = value
    return out


def sweep_cell(
    algo: str, cell: dict[str, object], base: LabSettings, seeds: int, swept: list[str]
) -> SweepCell:
    """The cell ``entrogym bandit`` would run for ``algo`` at grid point ``cell`` (validated);
    its table columns are the ``swept`` knobs."""
    entry = cell_entry(algo, cell)
    lab_knobs = {k: v for k, v in cell.items() if not k.startswith(ALGO_PREFIX)}
    settings = {**base.settings(), **lab_knobs, "seeds": seeds}
    lab = LabConfig(**settings, algos=lab_runs([entry]))
    lab.validate()
    values = cell_values(entry, cell)
    return SweepCell(algo, {k: v for k, v in values.items() if k in swept}, lab)


def sweep_cells(
    algos: list[str],
    grid: dict[str, list[object]],
    *,
    seeds: int = 3,
    base: LabSettings | None = None,
) -> list[SweepCell]:
    """Every preset at every grid point: ``grid`` maps knob names (``"lr"``,
    ``"algo.controller"``, ``"algo.controller.kp"``) to lists of values; every other setting
    comes from ``base`` (``LabSettings()`` by default). A knob with one value is fixed, not a
    column (sweep.json records it)."""
    check_grid(algos, grid)
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    swept = [k for k, v in grid.items() if len(v) > 1]
    base = base or LabSettings()
    return [
        sweep_cell(algo, cell, base, seeds, swept) for algo in algos for cell in grid_cells(grid)
    ]


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

    def cells(self) -> list[SweepCell]:
        return sweep_cells(self.algos, self.grid, seeds=self.seeds)


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
    args.cells()  # every cell resolves before anything runs (one line naming the problem)
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
        cells = args.cells()
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    print(f"bandit sweep: {len(cells)} cells x {args.seeds} seeds", flush=True)
    start = time.perf_counter()
    table = run_sweep(cells, workers=args.workers)
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
