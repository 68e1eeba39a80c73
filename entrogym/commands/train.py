"""``entrogym train``: options and YAML configs mapped onto ``TrainConfig``."""

from __future__ import annotations

import sys
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
    """Exit codes: 0 done, 2 bad input, 1 stopped (env errors over budget, non-finite steps, a
    run file that cannot be written; one line says why), 143 / 130 after SIGTERM / Ctrl-C
    (a checkpoint holds every completed iteration)."""

    def body() -> int:
        config = parse_config(argv)
        check_run_inputs(config)  # env, model, out, cache: one line before any model loads
        # heavy imports only once the input is valid
        from entrogym.train.shutdown import Interrupted
        from entrogym.train.trainer import STOPS, train

        try:
            train(config)
        except Interrupted as stop:
            print(f"{PROG}: {stop}; interrupted; resume with --resume", file=sys.stderr)
            return stop.exit_code
        except STOPS as stop:
            print(f"{PROG}: error: {' '.join(str(stop).split())}", file=sys.stderr)
            return 1
        return 0

    return run_command(PROG, body, interrupted="interrupted; resume with --resume")
