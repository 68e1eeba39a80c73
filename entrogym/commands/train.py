"""``entrogym train``: options and YAML configs mapped onto ``TrainConfig``."""

from __future__ import annotations

import sys
from typing import Any

from entrogym.commands.options import make_parser, parse_options, run_command
from entrogym.commands.preflight import check_run_inputs
from entrogym.train.config import TrainConfig
from entrogym.train.shutdown import Interrupted, ShutdownRequest, StopNow

PROG = "entrogym train"
# ``entrogym train --help``'s sections: every TrainConfig field in exactly one, in the order a
# run meets them (make_parser refuses a field left out, so a new option must be placed here).
OPTION_GROUPS: dict[str, tuple[str, ...]] = {
    "run: the run folder, resume, checkpoints, trackers, seeds and stopping": (
        "out", "resume", "init_adapter", "iterations", "checkpoint_every", "seed",
        "report_to", "max_bad_steps", "max_bad_steps_in_row", "shutdown_grace",
    ),
    "rollout: the task, the env, the model that samples and how (shared with eval and the demo)": (
        "env", "env_kwargs", "split", "tasks_per_iter", "samples", "early_stop_min_per_task",
        "early_stop_fraction", "max_env_error_fraction", "env_workers", "env_timeout",
        "env_max_memory_mb", "model", "engine", "engine_urls", "engine_dtype", "engine_decode",
        "request_timeout", "max_lora_rank", "max_loras", "max_num_seqs", "max_response_tokens",
        "max_turn_tokens", "max_context_tokens", "max_turns", "feedback_role", "tool_format",
        "on_turn_budget", "temperature", "system_prompt", "chat_template", "turn_rewards",
        "max_staleness",
    ),
    "learner: the LoRA policy, its scoring and its optimizer": (
        "dtype", "lr", "weight_decay", "max_grad_norm", "micro_batch_size",
        "micro_batch_tokens", "threads", "thread_split", "trim_heap", "sampler_entropy_check",
        "input_dependence_every", "input_dependence_tasks", "old_logprobs", "score_layout", "action_only_head", "lora_rank", "lora_target_modules",
        "lora_alpha", "softmax_fix",
    ),
    "algorithm: the preset (its parts and knobs are listed at the end)": ("algo",),
    "eval: held-out evaluation during training": (
        "eval_env", "eval_env_kwargs", "eval_split", "eval_every", "eval_tasks", "eval_samples",
    ),
}  # fmt: skip


def build_parser() -> Any:
    return make_parser(
        PROG,
        "RL-train a LoRA policy on a registered text env with a preset algorithm.",
        TrainConfig,
        groups=OPTION_GROUPS,
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
