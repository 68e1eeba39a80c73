"""Every number finite: a float option or knob given as inf or NaN (on the command line or in a
``--config`` file) is one line naming it, exit code 2, before any model loads, unless infinity
is one of its documented values (``algo.lever.upper_slack inf``: a one-sided constraint). An
importance-weight clip without ``--algo.is-correction`` would be ignored: it is refused. A
default derived from another option never fails on its own: ``--samples 2`` trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrogym.commands import eval as eval_command
from entrogym.commands import sequential as sequential_command
from entrogym.commands import train as train_command
from entrogym.commands.options import parse_options

TINY = ["--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32"]
ENTROPIC = ["--algo", "grpo", "--algo.lever", "entropic"]
AEPO = ["--algo", "grpo", "--algo.lever", "aepo"]

TRAIN_CASES = [
    ([*ENTROPIC, "--algo.controller.kp", "inf"], "algo.controller.kp must be a finite number, got inf"),
    ([*AEPO, "--algo.controller.max", "inf"], "algo.controller.max must be a finite number, got inf"),
    ([*AEPO, "--algo.controller.max", "nan"], "algo.controller.max must be a finite number, got nan"),
    (["--algo", "repo-r", "--algo.controller.target", "-inf"],
     "algo.controller.target must be a finite number, got -inf"),
    (["--algo", "grpo", "--algo.loss.eps_high", "inf"],
     "algo.loss.eps_high must be a finite number, got inf"),
    (["--lr", "inf"], "lr must be a finite number, got inf"),
    (["--lr", "nan"], "lr must be a finite number, got nan"),
    (["--lr", "1e999"], "lr must be a finite number, got inf"),
    (["--weight-decay", ".inf"], "weight_decay must be a finite number, got inf"),
    (["--temperature", "inf"], "temperature must be a finite number, got inf"),
    (["--env-timeout", "inf"], "env_timeout must be a finite number, got inf"),
    (["--request-timeout", "nan"], "request_timeout must be a finite number, got nan"),
    (["--shutdown-grace", "inf"], "shutdown_grace must be a finite number, got inf"),
    (["--early-stop-fraction", "nan"], "early_stop_fraction must be a finite number, got nan"),
    (["--max-env-error-fraction", "inf"],
     "max_env_error_fraction must be a finite number, got inf"),
    (["--algo", "grpo", "--algo.is-clip-max", "2"],
     "algo.is_clip_max 2.0 has no effect without algo.is_correction; add --algo.is-correction "
     "token_truncate (or token_mask, sequence_truncate, sequence_mask) or drop it"),
    (["--samples", "2", "--early-stop-min-per-task", "4"],
     "early_stop_min_per_task must be in [1, samples=2], got 4"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"), TRAIN_CASES, ids=[" ".join(c[0]) for c in TRAIN_CASES]
)
def test_a_non_finite_or_ignored_train_option_is_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError) as info:
        train_command.parse_config([*TINY, *argv])
    assert str(info.value) == message


def test_the_refusal_is_one_line_and_exit_2_before_anything_is_written(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    argv = [*TINY, *ENTROPIC, "--algo.controller.kp", "inf", "--iterations", "1",
            "--tasks-per-iter", "1", "--samples", "2", "--max-response-tokens", "2",
            "--out", str(out)]  # fmt: skip
    assert train_command.cli(argv) == 2
    assert capsys.readouterr().err == (
        "entrogym train: error: algo.controller.kp must be a finite number, got inf\n"
    )
    assert not out.exists()


def test_a_non_finite_value_in_a_config_file_is_one_line(tmp_path: Path, capsys) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(
        "lr: .inf\nalgo: {name: grpo, lever: {name: aepo}, controller: {max: .nan}}\n"
    )
    with pytest.raises(ValueError, match="must be a finite number, got "):
        train_command.parse_config([*TINY, "--config", str(config)])


def test_a_documented_infinity_is_taken() -> None:
    cfg = train_command.parse_config(
        [
            *TINY,
            "--algo",
            "grpo",
            "--algo.lever",
            "entropy-constraint",
            "--algo.lever.upper_slack",
            "inf",
        ]  # fmt: skip
    )
    assert cfg.algo.lever.params.upper_slack == float("inf")


def test_samples_2_trains_without_naming_a_knob_the_user_never_set() -> None:
    cfg = train_command.parse_config([*TINY, "--samples", "2"])
    assert cfg.samples == 2 and cfg.early_stop_min_per_task == 2
    assert train_command.parse_config(TINY).early_stop_min_per_task == 4  # the default


def test_other_commands_refuse_non_finite_numbers() -> None:
    parser, options = eval_command.build_parser(), eval_command.EvalConfig
    with pytest.raises(ValueError) as info:
        parse_options(parser, [*TINY, "--temperature", "inf"], options)
    assert str(info.value) == "temperature must be a finite number, got inf"
    parser, options = sequential_command.build_parser(), sequential_command.SequentialOptions
    with pytest.raises(ValueError) as info:
        parse_options(parser, ["--model", "tiny-random-llama", "--lr", "nan"], options)
    assert str(info.value) == "lr must be a finite number, got nan"
