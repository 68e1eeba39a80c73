"""One option system for every command: spellings, algorithm options, flags, errors."""

from __future__ import annotations

import importlib
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from entrogym.algos import ALGORITHMS, PART_REGISTRIES, algorithm_mapping
from entrogym.commands import bandit, demo, model, plot, theory
from entrogym.commands import eval as eval_command
from entrogym.commands.options import normalise_argv
from entrogym.commands.train import build_parser, parse_config
from entrogym.train.config import TrainConfig
from entrogym.train.folder.safety import saved_algorithm

COMMANDS = ("train", "eval", "bandit", "demo", "plot", "theory", "model", "appworld")


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_with_dashed_options(name: str, capsys) -> None:
    cli = importlib.import_module(f"entrogym.commands.{name}").cli
    argv = ["list", "--help"] if name == "model" else ["--help"]
    argv = ["setup", "--help"] if name == "appworld" else argv
    with pytest.raises(SystemExit) as exit_info:
        cli(argv)
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--config" in text and "--print-config" in text and "--print_config" not in text


def test_train_help_lists_every_preset_part_and_knob_dashed(capsys) -> None:
    text = build_parser().format_help()
    assert all(name in text for name in ALGORITHMS)
    for kind, registry in PART_REGISTRIES.items():
        for name in registry.names():
            assert f"    {name}: " in text, (kind, name)
            for f in fields(registry.params_class(name)):
                assert f"--algo.{kind}.{f.name.replace('_', '-')} " in text, (kind, name, f.name)
    assert "--tasks-per-iter" in text and "--tasks_per_iter" not in text


def test_algorithm_options_on_the_command_line_and_in_yaml(tmp_path: Path) -> None:
    argv = ["--algo", "repo-d", "--algo.controller", "pi", "--algo.controller.kp", "0.3"]
    cfg = parse_config(argv)
    algo = cfg.algo
    assert (algo.name, algo.controller.name, algo.controller.params.kp) == ("repo-d", "pi", 0.3)
    assert cfg.to_dict()["algo"]["controller"]["kp"] == 0.3  # typed, in the mapping it saves
    same = parse_config(["--algo=repo-d", "--algo.controller=pi", "--algo.controller.kp=0.3"])
    assert same.algo == algo
    swapped = parse_config(
        ["--algo", "grpo", "--algo.lever", "kl-cov", "--algo.lever.kl-cov-ratio", "0.01"]
    )
    assert swapped.algo.lever.params.kl_cov_ratio == 0.01
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text(
        "algo: {name: repo-d, controller: {name: pi, kp: 0.3}, lever: {centering: exact}, "
        "epochs: 1}\n"
    )
    cfg = parse_config(["--config", str(yaml_file)])
    assert (
        cfg.algo
        == parse_config([*argv, "--algo.lever.centering", "exact", "--algo.epochs", "1"]).algo
    )
    # command-line options merge over the file's: knobs join, a part named anew replaces
    cfg = parse_config(["--config", str(yaml_file), "--algo.controller.ki", "0.2"])
    assert (cfg.algo.controller.params.kp, cfg.algo.controller.params.ki) == (
        0.3,
        0.2,
    )
    cfg = parse_config(["--config", str(yaml_file), "--algo.controller", "paper"])
    assert cfg.algo.controller.name == "paper"  # pi's kp does not carry over
    assert cfg.algo.lever.params.centering == "exact"
    # the run folder's config.yaml holds the whole mapping, and reads back to the same algorithm
    saved = yaml.safe_load(yaml.safe_dump(cfg.to_dict()))
    assert saved["algo"] == algorithm_mapping(cfg.algo)
    assert saved_algorithm(saved) == cfg.algo
    old = tmp_path / "old.yaml"
    old.write_text("algo: dapo\n")
    assert parse_config(["--config", str(old), "--algo.epochs", "3"]).algo.epochs == 3


# 9 ** 7 nodes once its aliases expand, in 200 characters
ALIAS_BOMB = (
    "[&a [x,x,x,x,x,x,x,x,x], "
    + ", ".join(f"&{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcde", "bcdef", strict=True))
    + ", ["
    + ", ".join(["*f"] * 9)
    + "]]"
)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["--algo", "grpo", "--algo.zeta-max", "0.5"],
            "--algo.zeta-max is not an algorithm option",
        ),
        (["--algo", "ppo"], "unknown algorithm 'ppo'; presets: rloo, grpo"),
        (["--algo", "grpo", "--algo.controller", "pi"], "presets with a lever: repo-r, repo-d"),
        (["--algo", "repo-d", "--algo.controller", "pid"], "registered controllers: fixed, paper"),
        (["--algo", "repo-d", "--algo.lever", "mine:x"], "cannot import module 'mine'"),
        (
            ["--algo", "repo-d", "--algo.controller", "pi", "--algo.controller.kp", "-1"],
            "must be >= 0",
        ),
        (["--algo", "repo-d", "--algo.controller.target", "0"], "target must be > 0"),
        (
            ["--algo", "repo-d", "--algo.controller.min", "2", "--algo.controller.max", "1"],
            "min must be <=",
        ),
        (["--algo", "repo-d", "--algo.loss.eps-low", "-1"], "eps_low must be in [0, 1)"),
        (["--algo", "repo-d", "--algo.controller.kp", "0.3"], "controllers that have it: pi"),
        (["--algo", "repo-d", "--algo.controller.kp"], "needs a value"),
        # a controller takes only the knobs it reads: fixed holds its value and has no target
        (
            ["--algo", "repo-r", "--algo.controller", "fixed", "--algo.controller.kp", "0.3"],
            "algo.controller.kp is not a knob of controller 'fixed'; its knobs: init;",
        ),
        (
            ["--algo", "clip-cov", "--algo.controller.target", "0.8"],
            "algo.controller.target is not a knob of controller 'fixed'; its knobs: init;",
        ),
        # probe batches measure a ratio target: refused where there is none to measure
        (
            ["--algo", "clip-cov", "--algo.controller.target-probe", "2"],
            "algo.controller.target_probe is not a knob of controller 'fixed'; its knobs: init;",
        ),
        (
            ["--algo", "repo-r", "--algo.controller.target-unit", "nats"]
            + ["--algo.controller.target-probe", "2"],
            "target_probe measures a ratio target, and target_unit nats sets an absolute one",
        ),
        (
            ["--algo", "grpo", "--algo.lever", "entropy-constraint", "--algo.controller", "fixed"],
            "lever 'entropy-constraint' reads the target entropy, and controller 'fixed' has none",
        ),
        (["--algo", "{name: [1]}"], "algo.name must be a preset's name, got [1]"),
        (["--algo", "{name: repo-d, x: " + ALIAS_BOMB + "}"], "through its aliases; refused"),
    ],
)
def test_bad_algorithm_options_are_one_line_before_anything_loads(argv, needle, capsys) -> None:
    from entrogym.commands.train import cli

    assert cli([*argv, "--model", "/nonexistent-model-folder"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err


@pytest.mark.parametrize("option", ["--ignore-eos", "--bf16-round-logprobs"])
def test_benchmark_and_theory_switches_are_no_training_options(option, capsys) -> None:
    # ignore_eos is the benchmark's (Sampler.ignore_eos), bf16 rounding an emulation the
    # scorer applies on request (sequence_logprobs(..., bf16_round_logprobs=True))
    from entrogym.commands.train import cli

    assert option[2:].replace("-", "_") not in {f.name for f in fields(TrainConfig)}
    assert cli([option, "true", "--model", "/nonexistent-model-folder"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"unrecognized arguments: {option}" in err, err


def test_boolean_options_are_flags() -> None:
    assert parse_config(["--resume"]).resume is True
    assert parse_config(["--resume", "false"]).resume is False
    assert parse_config(["--resume", "--seed", "3"]).seed == 3
    assert parse_config(["--softmax-fix", "false", "--resume"]).softmax_fix is False


def test_lists_take_several_words_or_one_list() -> None:
    parser = build_parser()
    argv = normalise_argv(parser, ["--engine-urls", "http://a:1", "http://b:2", "--seed", "1"])
    assert argv == ['--engine_urls=["http://a:1", "http://b:2"]', "--seed", "1"]
    cfg = parse_config(["--engine", "vllm-server", "--engine-urls", "[http://a:1, http://b:2]"])
    assert cfg.engine_urls == ["http://a:1", "http://b:2"]


def test_shared_rollout_fields_are_validated() -> None:
    with pytest.raises(ValueError, match="threads must be in"):
        parse_config(["--threads", "100000"])
    with pytest.raises(ValueError, match="request_timeout"):
        parse_config(["--request-timeout", "0"])
    with pytest.raises(ValueError, match="engine_urls is for the vllm-server engine"):
        parse_config(["--engine", "hf", "--engine-urls", "http://a:1"])
    cfg = parse_config(
        ["--max-lora-rank", "64", "--lora-rank", "32", "--max-env-error-fraction", "0"]
    )
    assert cfg.engine_kwargs(lora_rank=cfg.lora_rank)["max_lora_rank"] == 64
    assert TrainConfig(lora_rank=32).engine_kwargs(lora_rank=32)["max_lora_rank"] == 32
    with pytest.raises(ValueError, match="engine_dtype"):
        TrainConfig(engine_dtype="int8")


def test_eval_takes_plain_urls_and_a_module_env() -> None:
    from entrogym.commands.options import parse_options

    argv = ["--env", "custom_env:examples/Unscramble-v0", "--engine", "vllm-server"]
    cfg = parse_options(
        eval_command.build_parser(),
        [*argv, "--urls", "http://127.0.0.1:8000"],
        eval_command.EvalConfig,
    )
    assert cfg.engine_urls == ["http://127.0.0.1:8000"] and cfg.split is None
    with pytest.raises(ValueError, match="env is required"):
        parse_options(eval_command.build_parser(), [], eval_command.EvalConfig)


def test_bandit_applies_algorithm_options_to_the_presets() -> None:
    from entrogym.commands.options import parse_options

    opts = parse_options(
        bandit.build_parser(),
        ["--algos", "grpo,repo-d", "--algo.controller", "pi", "--algo.epochs", "1"],
        bandit.BanditOptions,
    )
    grpo, repo_d = (run.algorithm for run in opts.lab().algos)
    assert repo_d.controller.name == "pi" and repo_d.epochs == 1
    assert grpo.epochs == 1 and grpo.controller is None
    variant = parse_options(
        bandit.build_parser(),
        ["--algos", "grpo", "repo-d --algo.controller pi --algo.controller.kp 0.2"],
        bandit.BanditOptions,
    ).lab()
    assert variant.algos[1].algorithm.controller.params.kp == 0.2
    assert variant.algos[1].label == "repo-d --algo.controller pi --algo.controller.kp 0.2"


def test_bandit_cli_rejects_options_no_preset_takes(capsys) -> None:
    assert bandit.cli(["--algos", "rloo", "--algo.controller", "pi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none of rloo has one" in err


@pytest.mark.parametrize(
    ("cli", "argv", "needle"),
    [
        (theory.cli, ["--n_policies", "10"], "n_policies must be >= 200"),
        (theory.cli, ["--n-policies", "10"], "n_policies must be >= 200"),
        (demo.cli, ["--algos", "grpo", "ppo"], "ppo"),
        (plot.cli, ["/nonexistent-run"], "nonexistent-run"),
        (model.cli, ["prepare", "gpt-5"], "gpt-5"),
        (eval_command.cli, ["--env", "entrogym/Arithmetic-v0", "--no-such-option", "1"], "no-such"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(cli, argv, needle, capsys) -> None:
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_print_config_shows_the_algorithm_the_command_line_gives(tmp_path: Path, capsys) -> None:
    """--print-config prints what the run would use: --algo options merged over the file's
    algo: mapping (they are read apart from jsonargparse, which printed the file's alone)."""
    from entrogym.commands import train

    config = tmp_path / "run.yaml"
    config.write_text("algo: {name: grpo, minibatch_size: 8}\niterations: 3\n")
    argv = ["--config", str(config), "--algo", "rloo", "--algo.minibatch-size", "none"]
    with pytest.raises(SystemExit) as exit_info:
        train.cli([*argv, "--print-config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["algo"] == algorithm_mapping(parse_config(argv).algo)
    assert (printed["algo"]["name"], printed["algo"]["minibatch_size"]) == ("rloo", None)
    assert printed["iterations"] == 3
    with pytest.raises(SystemExit):  # jsonargparse's flags still apply
        train.cli([*argv, "--print-config=skip_default"])
    assert yaml.safe_load(capsys.readouterr().out)["algo"]["name"] == "rloo"
