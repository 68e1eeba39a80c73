"""``entrogym train``: options and YAML configs mapped onto ``TrainConfig``."""

from __future__ import annotations

import sys
from typing import Any

from entrogym.commands.options import make_parser, parse_options, run_command
from entrogym.commands.preflight import check_run_inputs
from entrogym.train.config import TrainConfig
from entrogym.train.shutdown import Interrupted, ShutdownRequest, StopNow

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
        # A scheduler's SIGTERM may come at any moment, start-up included: from here on it
        # asks the run to stop (entrogym.train.shutdown).
        with ShutdownRequest(config.shutdown_grace, PROG) as shutdown:
            try:
                return run(config, shutdown)
            except Interrupted as stop:
                print(f"{PROG}: {stop}; interrupted; resume with --resume", file=sys.stderr)
                return stop.exit_code
            except StopNow as stop:  # a second signal while the run was closing
                print(f"{PROG}: stopped at once; interrupted; resume with --resume",
                      file=sys.stderr)  # fmt: skip
                return 128 + stop.signum

    return run_command(PROG, body, interrupted="interrupted; resume with --resume")


def run(config: TrainConfig, shutdown: ShutdownRequest) -> int:
    """Train ``config``: 0 when done, 1 (and one line) when the run stopped early."""
    check_run_inputs(config)  # env, model, out, cache: one line before any model loads
    # heavy imports only once the input is valid
    from entrogym.train.trainer import STOPS, train

    try:
        train(config, shutdown)
    except STOPS as stop:
        print(f"{PROG}: error: {' '.join(str(stop).split())}", file=sys.stderr)
        return 1
    return 0
