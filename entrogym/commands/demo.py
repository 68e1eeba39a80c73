"""``entrogym demo`` (what ``make demo`` runs): entropy control against GRPO on SmolLM2, on a CPU budget."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from entrogym.commands.demo_runs import run_option
from entrogym.commands.options import make_parser, parse_options, run_command
from entrogym.experiments.config import (
    DEFAULT_ITERATIONS,
    DEFAULT_LR,
    DEFAULT_RUNS,
    DEFAULT_SEEDS,
    PASS_SAMPLES,
    PASS_TASKS,
    DemoRun,
)

PROG = "entrogym demo"


@dataclass
class DemoOptions:
    """The demo's knobs (the rollout settings are fixed: entrogym.experiments.AGENT).

    Args:
        out: output folder (must be empty or new).
        algos: runs to compare, as words or comma-separated: a preset (the paper's values) or
            a variant, the preset followed by its algorithm options, e.g.
            ``"repo-d --algo.controller pi --algo.controller.kp 0.3"``; ``NAME=`` in front
            (``"pi=repo-d --algo.controller pi"``) gives a run the short label the table,
            the log and the plots show. Labels must be distinct.
        iterations: RL iterations per run.
        lr: AdamW learning rate of the LoRA.
        eval_tasks: held-out tasks per evaluation (0: no held-out evaluation).
        seeds: one run per listed seed and run; a seed drives task sampling, rollouts and
            minibatch order. The goal must hold on every seed.
        engine: rollout engine (None: the demo's default, entrogym.experiments.AGENT.engine).
        workers: worker processes running the jobs side by side, each with cores // workers
            torch threads (at least 1; None: two per core, or fewer when there are fewer jobs,
            so both cores stay busy until the last run ends).
        pass_tasks: held-out tasks on which each final policy and the base model are scored
            with pass_samples samples each, for pass@k (0: no pass@k).
        pass_samples: samples per task for pass@k (k = 1, 4, 16, 64 up to it, and itself).
    """

    out: str = "runs/demo"
    algos: list[str] = field(default_factory=lambda: list(DEFAULT_RUNS))
    iterations: int = DEFAULT_ITERATIONS
    lr: float = DEFAULT_LR
    eval_tasks: int = 40
    seeds: list[int] = field(default_factory=lambda: list(DEFAULT_SEEDS))
    engine: str | None = None
    workers: int | None = None
    pass_tasks: int = PASS_TASKS
    pass_samples: int = PASS_SAMPLES

    def __post_init__(self) -> None:
        from entrogym.agents.engines import ENGINE_KINDS
        from entrogym.algos.presets import ALGORITHMS

        # words or comma-separated: --algos grpo,"repo-d --algo.controller pi"
        self.algos = [a.strip() for word in self.algos for a in word.split(",") if a.strip()]
        if not self.algos:
            raise ValueError(f"algos: empty list; choose from {', '.join(ALGORITHMS)}")
        labels: dict[str, str] = {}
        for run in self.runs:
            if run.label in labels:
                raise ValueError(f"algos: {labels[run.label]!r} and {run.text!r} are both "
                                 f"labelled {run.label!r}; give one of them another NAME=")  # fmt: skip
            labels[run.label] = run.text
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        if self.eval_tasks < 0:
            raise ValueError(f"eval_tasks must be >= 0 (0: no evaluation), got {self.eval_tasks}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: give one or more distinct seeds, got {self.seeds}")
        cores = os.cpu_count() or 1
        if self.workers is not None and not 1 <= self.workers <= 2 * cores:
            raise ValueError(f"workers must be from 1 to {2 * cores} (two per core of this "
                             f"machine), got {self.workers}")  # fmt: skip
        if self.pass_tasks < 0 or self.pass_samples < 0:
            raise ValueError(f"pass_tasks and pass_samples must be >= 0 (0: no pass@k), got "
                             f"{self.pass_tasks} and {self.pass_samples}")  # fmt: skip
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.engine is not None and self.engine not in ENGINE_KINDS:
            raise ValueError(f"engine: {self.engine!r}; choose from {', '.join(ENGINE_KINDS)}")

    @cached_property
    def runs(self) -> list[DemoRun]:
        """The runs ``algos`` names, read once (ValueError naming the one that does not parse)."""
        return [run_option("algos", text) for text in self.algos]


def build_parser() -> Any:
    return make_parser(PROG, (__doc__ or "").split("\n")[0], DemoOptions)


def cli(argv: list[str]) -> int:
    def body() -> int:
        from entrogym.experiments.run import run_demo

        opts = parse_options(build_parser(), argv, DemoOptions)
        run_demo(Path(opts.out), opts.runs, opts.iterations, opts.lr, opts.eval_tasks,
                 seeds=opts.seeds, engine=opts.engine, workers=opts.workers,
                 pass_tasks=opts.pass_tasks, pass_samples=opts.pass_samples)  # fmt: skip
        return 0

    return run_command(PROG, body, interrupted="interrupted; rerun with a new --out")
