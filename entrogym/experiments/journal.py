"""What a stopped ``entrogym sequential`` keeps, so that ``--resume`` goes on from it.

``OUT/plan.json`` holds the experiment (its task pair and settings), written before the first
job starts; ``OUT/jobs.jsonl`` one line per finished job, its key and its result, appended and
synced as each job ends. ``--resume`` refuses a command that describes another experiment (one
line naming the differences), takes every finished job's result from the journal instead of
running it again, and runs the rest: a training run that was stopped after a checkpoint
continues from it (the trainer's own ``--resume``), one stopped before starts over.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from entrogym.atomic import atomic_write_text

PLAN_FILE, JOURNAL_FILE = "plan.json", "jobs.jsonl"
# what may change between a stopped experiment and its --resume: how it is run, not what
RESUMABLE = frozenset({"workers", "resume"})


def _differences(saved: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(saved.keys() | new.keys()):
        if key in RESUMABLE:
            continue
        a, b = saved.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} {a!r} -> {b!r}")
    return out


def open_experiment(out: Path, plan: dict[str, Any], resume: bool) -> None:
    """Check ``out`` for the experiment ``plan`` (plain JSON data) and record it there.
    Without ``resume`` the folder must be new or empty; with it, a folder holding a plan must
    hold this one. ValueError (one line) otherwise."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} is a file; pass a folder for the experiment")
    if out.is_dir() and any(out.iterdir()):
        if not resume:
            raise ValueError(f"{out} is not empty; continue its experiment with --resume, or "
                             "pass --out NEW_DIR")  # fmt: skip
        saved_file = out / PLAN_FILE
        if not saved_file.is_file():
            raise ValueError(f"--resume: {out} holds no {PLAN_FILE} (not an experiment of "
                             "entrogym sequential); pass --out NEW_DIR")  # fmt: skip
        saved = json.loads(saved_file.read_text(encoding="utf-8"))
        differ = _differences(saved, json.loads(json.dumps(plan)))
        if differ:
            raise ValueError(
                f"--resume: this command describes another experiment than the one in {out} "
                f"({'; '.join(differ)}); pass its options (in {out / PLAN_FILE}) or --out NEW_DIR"
            )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / PLAN_FILE, json.dumps(plan, indent=2) + "\n")


class JobJournal:
    """The finished jobs of an experiment in ``out/jobs.jsonl``, by key."""

    def __init__(self, out: Path) -> None:
        self.path = out / JOURNAL_FILE
        self.done: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                    self.done[str(entry["key"])] = entry["result"]
                except (ValueError, KeyError, TypeError):  # a line cut short by a kill
                    continue

    def get(self, key: str) -> dict[str, Any] | None:
        return self.done.get(key)

    def add(self, key: str, result: dict[str, Any]) -> None:
        """Record a finished job (synced: a kill right after it keeps it)."""
        if key in self.done:
            return
        self.done[key] = result
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"key": key, "result": result}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
