"""``entrogym plot RUN [RUN ...] [--out DIR] [--metric NAME] [--split NAME]``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from entrogym.commands.options import make_parser, parse_options, run_command

PROG = "entrogym plot"


@dataclass
class PlotOptions:
    """Which runs to draw and where.

    Args:
        runs: run folders (holding metrics.jsonl).
        out: output folder (default: the first run's folder).
        metric: eval-row field plotted as accuracy (default: the first present of accuracy,
            success_rate, tgc, pass@1).
        split: eval split to plot (default: every eval row).
    """

    runs: list[str] = field(default_factory=list)
    out: str | None = None
    metric: str | None = None
    split: str | None = None


def build_parser() -> Any:
    return make_parser(
        PROG,
        "Draw the paper's Figure 1 panels (entropy, accuracy, accuracy vs cumulative entropy) "
        "and, for multi-turn runs, their per-turn metrics (turns.png) from run folders into "
        "PNG files.",
        PlotOptions,
        positionals=("runs",),
    )


def plot(opts: PlotOptions) -> list[Any]:
    from entrogym.train.evaluation.plots import plot_runs

    return plot_runs(opts.runs, opts.out or opts.runs[0], metric=opts.metric, split=opts.split)


def cli(argv: list[str]) -> int:
    def body() -> int:
        for path in plot(parse_options(build_parser(), argv, PlotOptions)):
            print(path)
        return 0

    return run_command(PROG, body)
