"""``entrogym demo`` (what ``make demo`` runs): REPO-R against GRPO on SmolLM2, on a CPU budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entrogym.commands.options import make_parser, parse_options, run_command

PROG = "entrogym demo"


@dataclass
class DemoOptions:
    """The demo's knobs (the rollout settings are fixed: entrogym.demo.AGENT).

    Args:
        out: output folder (must be empty or new).
        algos: presets to compare.
        iterations: RL iterations per preset.
        lr: AdamW learning rate of the LoRA.
        eval_tasks: held-out tasks per evaluation.
    """

    out: str = "runs/demo"
    algos: list[str] = field(default_factory=lambda: ["grpo", "repo-r"])
    iterations: int = 5
    lr: float = 1e-3
    eval_tasks: int = 40

    def __post_init__(self) -> None:
        from entrogym.algos.presets import ALGORITHMS

        unknown = [a for a in self.algos if a not in ALGORITHMS]
        if unknown or not self.algos:
            raise ValueError(
                f"algos: unknown {unknown or 'empty list'}; choose from {', '.join(ALGORITHMS)}"
            )
        for name in ("iterations", "eval_tasks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


def build_parser() -> Any:
    from entrogym import demo

    return make_parser(PROG, (demo.__doc__ or "").split("\n")[0], DemoOptions)


def cli(argv: list[str]) -> int:
    def body() -> int:
        from entrogym.demo import run_demo

        opts = parse_options(build_parser(), argv, DemoOptions)
        run_demo(Path(opts.out), opts.algos, opts.iterations, opts.lr, opts.eval_tasks)
        return 0

    return run_command(PROG, body, interrupted="interrupted; rerun with a new --out")
