"""``entrogym demo`` (what ``make demo`` runs): REPO-R against GRPO on SmolLM2, on a CPU budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entrogym.commands.options import make_parser, parse_options, run_command
from entrogym.demo import DEFAULT_ITERATIONS, DEFAULT_LR, DEFAULT_RUNS

PROG = "entrogym demo"


@dataclass
class DemoOptions:
    """The demo's knobs (the rollout settings are fixed: entrogym.demo.AGENT).

    Args:
        out: output folder (must be empty or new).
        algos: runs to compare, as words or comma-separated: a preset (the paper's values) or
            a labelled variant ``preset:knob=value:...``, e.g.
            ``repo-r:zeta_init=0.05:zeta_max=0.5``.
        iterations: RL iterations per run.
        lr: AdamW learning rate of the LoRA.
        eval_tasks: held-out tasks per evaluation.
        seed: seeds task sampling, rollouts and minibatch order (the same for every run).
        engine: rollout engine (None: the demo's default, entrogym.demo.AGENT.engine).
    """

    out: str = "runs/demo"
    algos: list[str] = field(default_factory=lambda: list(DEFAULT_RUNS))
    iterations: int = DEFAULT_ITERATIONS
    lr: float = DEFAULT_LR
    eval_tasks: int = 40
    seed: int = 0
    engine: str | None = None

    def __post_init__(self) -> None:
        from entrogym.agents.engines import ENGINE_KINDS
        from entrogym.algos.presets import ALGORITHMS
        from entrogym.demo import parse_run

        # words or comma-separated: --algos grpo,repo-r:zeta_max=0.5
        self.algos = [a.strip() for word in self.algos for a in word.split(",") if a.strip()]
        if not self.algos:
            raise ValueError(f"algos: empty list; choose from {', '.join(ALGORITHMS)}")
        for spec in self.algos:
            try:
                parse_run(spec)
            except ValueError as err:
                raise ValueError(f"algos: {spec!r}: {err}") from None
        for name in ("iterations", "eval_tasks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.engine is not None and self.engine not in ENGINE_KINDS:
            raise ValueError(f"engine: {self.engine!r}; choose from {', '.join(ENGINE_KINDS)}")


def build_parser() -> Any:
    from entrogym import demo

    return make_parser(PROG, (demo.__doc__ or "").split("\n")[0], DemoOptions)


def cli(argv: list[str]) -> int:
    def body() -> int:
        from entrogym.demo import run_demo

        opts = parse_options(build_parser(), argv, DemoOptions)
        run_demo(Path(opts.out), opts.algos, opts.iterations, opts.lr, opts.eval_tasks,
                 seed=opts.seed, engine=opts.engine)  # fmt: skip
        return 0

    return run_command(PROG, body, interrupted="interrupted; rerun with a new --out")
