"""``entrogym compare RUN [RUN ...] [--split NAME] [--claims A>B:MEASURE ...] [--out DIR]``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entrogym.atomic import atomic_write_text
from entrogym.commands.options import make_parser, parse_options, run_command
from entrogym.train.evaluation.compare import PAPER_CLAIMS, compare, format_report, parse_claim

PROG = "entrogym compare"


@dataclass
class CompareOptions:
    """Which runs to set side by side.

    Args:
        runs: run folders (holding metrics.jsonl); a folder named LABEL-sN is seed N of LABEL.
        split: eval split whose last row is each run's final accuracy (default: the first
            split in its eval rows).
        challenge: subfolder of each run holding a second split's `entrogym eval` output
            (eval.json), reported beside the final accuracy where present.
        claims: comparisons, each A>B:MEASURE (A's MEASURE above B's, paired by seed);
            default: the paper's (rloo>grpo:cumulative_entropy, repo-r>grpo:final_accuracy,
            adapo>dapo:final_accuracy, held>grpo:final_accuracy).
        out: folder for compare.json (default: print only).
    """

    runs: list[str] = field(default_factory=list)
    split: str | None = None
    challenge: str = "challenge"
    claims: list[str] = field(default_factory=lambda: list(PAPER_CLAIMS))
    out: str | None = None


def build_parser() -> Any:
    return make_parser(
        PROG,
        "Set runs side by side: each run's accuracy, entropy curve, entropy by turn, where "
        "gradient signal stopped and input dependence; each configuration's final accuracy "
        "over seeds with its 95 % interval; the paper's claims as paired differences; and "
        "how final accuracy goes with cumulative entropy and with input dependence.",
        CompareOptions,
        positionals=("runs",),
    )


def check(opts: CompareOptions) -> None:
    """One-line errors for bad input, before any folder is read."""
    if not opts.runs:
        raise ValueError("give at least one run folder: entrogym compare runs/grpo-s0 runs/rloo-s0")
    missing = [r for r in opts.runs if not (Path(r) / "metrics.jsonl").is_file()]
    if missing:
        raise ValueError(f"no metrics.jsonl in {', '.join(missing)}: pass entrogym run folders")
    for text in opts.claims:
        parse_claim(text)


def cli(argv: list[str]) -> int:
    def body() -> int:
        opts = parse_options(build_parser(), argv, CompareOptions)
        check(opts)
        result = compare(opts.runs, split=opts.split, challenge=opts.challenge,
                         claims=tuple(opts.claims))  # fmt: skip
        print(format_report(result))
        if opts.out:
            out = Path(opts.out)
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / "compare.json", json.dumps(result, indent=1) + "\n")
            print(f"wrote {out / 'compare.json'}")
        return 0

    return run_command(PROG, body)
