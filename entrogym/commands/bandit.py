"""``entrogym bandit``: the tabular theory lab (every preset on ``entrogym/Bandit-v0``).

``entrogym bandit sweep ...`` runs the lab over a grid of knobs
(``entrogym.commands.bandit_sweep``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entrogym.commands.lab_runs import DEFAULT_ALGOS, lab_config
from entrogym.commands.options import make_parser, parse_options, run_command
from entrogym.experiments.lab_config import LabConfig, LabSettings

PROG = "entrogym bandit"
DESCRIPTION = (
    "Train a tabular softmax policy on bandits with every preset. "
    "`entrogym bandit sweep --algos PRESET --KNOB V1,V2 ...` runs the lab over a grid of lab "
    "and algorithm options (e.g. --lr 4,16 --algo.controller paper,pi) and writes a table and "
    "heatmaps; see `entrogym bandit sweep --help`."
)


@dataclass
class BanditOptions(LabSettings):
    """The lab's settings, what it runs, and where to write.

    Args:
        algos: presets or labelled variants to train (each with every seed), as words or
            comma-separated (``--algos rloo,grpo "repo-d --algo.controller pi"``).
        algo: algorithm options applied to every chosen preset (``--algo.controller pi``);
            lever and controller options apply to the presets that have a lever unless they
            name the lever. An entry's own options win.
        out: output folder (metrics.jsonl, summary.json, entropy.png).
        json: print the summary as one JSON object.
    """

    algos: list[str] = field(default_factory=lambda: list(DEFAULT_ALGOS))
    algo: dict[str, Any] = field(default_factory=dict)
    out: str = "runs/bandit"
    json: bool = False

    def lab(self) -> LabConfig:
        """The :class:`LabConfig` these options describe (validated)."""
        entries = [a.strip() for word in self.algos for a in word.split(",") if a.strip()]
        return lab_config(entries, self.algo, **self.settings())


def build_parser() -> Any:
    return make_parser(PROG, DESCRIPTION, BanditOptions)


def cli(argv: list[str]) -> int:
    """``entrogym bandit --algos ... --seeds 3 --iters N --out DIR [--json]``, or
    ``entrogym bandit sweep ...`` (the grid sweep)."""
    if argv and argv[0] == "sweep":
        from entrogym.commands.bandit_sweep import sweep_cli

        return sweep_cli(argv[1:], prog=f"{PROG} sweep")

    def body() -> int:
        from entrogym.experiments.lab import run_lab
        from entrogym.experiments.lab_report import format_table

        opts = parse_options(build_parser(), argv, BanditOptions)
        lab = opts.lab()
        if not opts.json:
            print(
                f"bandit lab: {len(lab.algos)} presets x {lab.seeds} seeds x {lab.iters} "
                f"iterations ({lab.n_states} states, {lab.n_arms} arms, "
                f"{lab.samples_per_state} samples/state)",
                flush=True,
            )
        summary = run_lab(lab, Path(opts.out), progress=not opts.json)
        if opts.json:
            print(json.dumps(summary))
        else:
            print(format_table(summary))
            out = opts.out
            print(f"wrote {out}/metrics.jsonl, {out}/summary.json, {out}/entropy.png")
        return 0

    return run_command(PROG, body)
