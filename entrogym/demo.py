"""``entrogym demo`` (what ``make demo`` runs): the bandit theory lab with its defaults.

Trains the tabular softmax policy with all nine presets over 3 seeds (about a minute on 2 CPU
cores), writes ``runs/demo/{metrics.jsonl,summary.json,entropy.png}`` and prints the summary
table with the paper's predictions checked. Every ``entrogym bandit`` option is accepted.
"""

from __future__ import annotations

from entrogym.theory import lab


def cli(argv: list[str]) -> int:
    return lab.cli(argv, prog="entrogym demo", default_out="runs/demo")
