"""``entrogym train``: options and YAML configs mapped onto ``TrainConfig``."""

from __future__ import annotations

from typing import Any

from entrogym.commands.options import make_parser, parse_options, run_command
from entrogym.commands.preflight import check_run_inputs
from entrogym.train.config import TrainConfig

PROG = "entrogym train"


def build_parser() -> Any:
    return make_parser(
        PROG,
        "RL-train a LoRA policy on a registered text env with a preset algorithm.",
        TrainConfig,
    )


def parse_config(argv: list[str]) -> TrainConfig:
    """``TrainConfig`` from command-line options (ValueError on bad input)."""
    return parse_options(build_parser(), argv, TrainConfig)


def cli(argv: list[str]) -> int:
    def body() -> int:
        config = parse_config(argv)
        check_run_inputs(config)  # env, model, out, cache: one line before any model loads
        from entrogym.train.trainer import train  # heavy imports only once the input is valid

        train(config)
        return 0

    return run_command(PROG, body, interrupted="interrupted; resume with --resume")
