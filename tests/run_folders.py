"""Run folders as the trainer and ``entrogym eval`` write them, for the tests of what reads
them back (``entrogym compare``, the world's record)."""

from __future__ import annotations

import json
from pathlib import Path

from entrogym.train.folder.metrics import MetricsLogger


def write_run(path: Path, *, seed: int, entropies: list[float], evals: dict[int, float],
               zero_adv: list[int] | None = None, dependence: dict[int, float] | None = None,
               challenge: float | None = None) -> None:  # fmt: skip
    """A run folder as the trainer writes it: config.yaml, train rows (4 groups), eval rows,
    and, if given, a second split's eval.json as `entrogym eval` writes it."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"algo:\n  name: grpo\nseed: {seed}\n")
    with MetricsLogger(path, tensorboard=False) as log:
        for it, h in enumerate(entropies):
            row = {"iteration": it, "algo": "grpo", "entropy": h, "groups": 4,
                   "zero_adv_groups": (zero_adv or [0] * len(entropies))[it],
                   "entropy_by_turn": {"1": h / 2, "2": h}}  # fmt: skip
            if dependence and it in dependence:
                row["input_dependence"] = dependence[it]
            log.log(row, step=it)
            if it in evals:
                log.log({"kind": "eval", "iteration": it, "split": "test_normal",
                         "tgc": evals[it], "accuracy": evals[it]}, step=it)  # fmt: skip
    if challenge is not None:
        (path / "challenge").mkdir()
        (path / "challenge" / "eval.json").write_text(json.dumps({"summary": {"tgc": challenge}}))
