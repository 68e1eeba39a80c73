"""The multi-turn world's comparison of the presets, recorded for the demo's report.

``benchmarks/studies/world_presets.py --record FILE`` sets every finished run of its grid side
by side (:func:`entrogym.train.evaluation.compare.compare`) and keeps, per entropy-keeping
configuration, its final ``test_normal`` TGC minus GRPO's, paired by seed, with the 95 %
interval. The record measured on this project's machine ships in ``data/`` (its runs are in
``benchmarks/results/world-presets`` and the results log); the demo prints its line
(:func:`world_line`), which says whether the effect the paper reports on AppWorld shows here.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from entrogym.train.evaluation.interval import Interval

# the configurations that keep entropy (the paper's REPO-R, REPO-D and ADAPO; the demo's held
# run), each set against GRPO's final test_normal TGC
ENTROPY_KEEPING = ("held", "repo-r", "repo-d", "adapo")
BASELINE = "grpo"
# issue 69's "best final policy" goal: one of them ends >= GRPO + 0.05, as a mean over >= 6
# seeds with its 95 % interval above 0
GOAL_GAIN, GOAL_SEEDS = 0.05, 6
RECORD = "world-presets.json"


def world_claims() -> tuple[str, ...]:
    """Each entropy-keeping configuration's final accuracy above GRPO's, as compare claims."""
    return tuple(f"{label}>{BASELINE}:final_accuracy" for label in ENTROPY_KEEPING)


def record_world(run_dirs: list[str | Path], *, date: str, provenance: str) -> dict[str, Any]:
    """The record of ``run_dirs`` (``LABEL-sSEED`` folders): its date and provenance, and each
    claim's label, seeds and paired difference, as :func:`world_line` reads them."""
    # here, not at the top: compare draws with matplotlib, which the demo's start need not load
    from entrogym.train.evaluation.compare import compare

    result = compare(run_dirs, claims=world_claims())
    return {
        "date": date,
        "provenance": provenance,
        "runs": len(result["runs"]),
        "claims": [
            {"label": c["a"], "seeds": c["seeds"], "difference": c["difference"]}
            for c in result["claims"]
        ],
    }


def effect_shown(difference: Interval) -> bool:
    """The goal: a mean gain of at least GOAL_GAIN over at least GOAL_SEEDS seeds, with the
    95 % interval above 0."""
    return difference.n >= GOAL_SEEDS and difference.mean >= GOAL_GAIN and difference.above(0)


def world_line(recorded: dict[str, Any]) -> str:
    """One line: each configuration's mean TGC minus GRPO's (and over how many seeds), then
    whether any shows the effect."""
    measured = [(c["label"], Interval(**c["difference"])) for c in recorded["claims"]
                if c["difference"] is not None]  # fmt: skip
    if not measured:
        return "no configuration ran beside GRPO on a common seed"
    parts = ", ".join(f"{label} {d.mean:+.3f} (n={d.n})" for label, d in measured)
    shown = [label for label, d in measured if effect_shown(d)]
    goal = f"+{GOAL_GAIN:.2f} over >= {GOAL_SEEDS} seeds, 95 % interval above 0"
    verdict = (f"the effect shows ({goal}): {', '.join(shown)}" if shown
               else f"no effect shown (goal: {goal})")  # fmt: skip
    return f"TGC minus GRPO's by seed: {parts}; {verdict}"


def recorded_world() -> dict[str, str] | None:
    """The shipped record's ``{"source", "date", "line"}``, None where none ships."""
    shipped = resources.files("entrogym.experiments").joinpath("data", RECORD)
    if not shipped.is_file():
        return None
    recorded = json.loads(shipped.read_text())
    return {"source": recorded["provenance"], "date": recorded["date"],
            "line": world_line(recorded)}  # fmt: skip
