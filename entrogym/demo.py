"""``entrogym demo`` (what ``make demo`` runs): the bandit theory lab with its defaults.

Trains the tabular softmax policy with all nine presets over 3 seeds (about a minute on 2 CPU
cores), writes ``runs/demo/{metrics.jsonl,summary.json,entropy.png}`` and prints the summary
table with the paper's predictions checked. Every ``entrogym bandit`` option is accepted.
"""

from __future__ import annotations

import sys
from pathlib import Path

from entrogym.theory.lab import build_parser, lab_from_args, run_lab
from entrogym.theory.lab_report import format_table


def cli(argv: list[str]) -> int:
    args = build_parser(prog="entrogym demo", default_out="runs/demo").parse_args(argv)
    lab = lab_from_args(args)
    try:
        lab.validate()
    except ValueError as e:
        print(f"entrogym demo: {e}", file=sys.stderr)
        return 2
    print(
        f"bandit lab: {len(lab.algos)} presets x {lab.seeds} seeds x {lab.iters} iterations "
        f"({lab.n_states} states, {lab.n_arms} arms, {lab.samples_per_state} samples per state)",
        flush=True,
    )
    summary = run_lab(lab, Path(args.out), progress=True)
    print(format_table(summary))
    print(f"wrote {args.out}/metrics.jsonl, {args.out}/summary.json, {args.out}/entropy.png")
    return 0
