"""One option system for every command: spellings, nested preset knobs, flags, errors."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from entrogym.algos.presets import ALGORITHMS
from entrogym.commands import bandit, demo, model, plot, theory
from entrogym.commands import eval as eval_command
from entrogym.commands.options import normalise_argv
from entrogym.commands.train import build_parser, parse_config
from entrogym.train.config import TrainConfig, preset_knobs

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


def test_train_help_lists_every_preset_knob_dashed(capsys) -> None:
    text = build_parser().format_help()
    for knob in {k for name in ALGORITHMS for k in preset_knobs(name)}:
        assert f"--algo.{knob.replace('_', '-')}" in text, knob
    assert "--tasks-per-iter" in text and "--tasks_per_iter" not in text
    assert "--algo.entropy-control" not in text and "--algo.control " not in text


def test_nested_knobs_on_the_command_line_and_in_yaml(tmp_path: Path) -> None:
    cfg = parse_config(["--algo", "repo-r", "--algo.zeta-max", "0.5"])
    assert (cfg.algo.name, cfg.algorithm().zeta_max) == ("repo-r", 0.5)
    cfg = parse_config(["--algo", "repo-r", "--algo.zeta_max", "0.5"])  # underscores too
    assert cfg.algorithm().zeta_max == 0.5
    new = tmp_path / "new.yaml"
    new.write_text("algo: {name: repo-d, zeta_max: 3.0, epochs: 1}\n")
    cfg = parse_config(["--config", str(new)])
    assert (cfg.algorithm().zeta_max, cfg.algorithm().epochs) == (3.0, 1)
    old = tmp_path / "old.yaml"
    old.write_text("algo: dapo\nalgo_overrides: {minibatch_size: 256}\n")
    cfg = parse_config(["--config", str(old), "--algo.epochs", "3"])
    algo = cfg.algorithm()
    assert (algo.name, algo.minibatch_size, algo.epochs, algo.eps_high) == ("dapo", 256, 3, 0.28)
    # the run folder's config.yaml keeps only the knobs that are set
    assert cfg.to_dict()["algo"] == {"name": "dapo", "epochs": 3}
    assert TrainConfig(**cfg.to_dict()).algorithm() == algo


def test_unknown_knob_is_named_with_the_presets_knobs() -> None:
    with pytest.raises(ValueError, match=r"algo.zeta_max is not a knob of preset 'grpo'") as err:
        parse_config(["--algo", "grpo", "--algo.zeta-max", "0.5"])
    assert "minibatch_size" in str(err.value) and "zeta_min" not in str(err.value)
    with pytest.raises(ValueError, match="known presets"):
        parse_config(["--algo", "ppo"])
    with pytest.raises(ValueError, match="unknown knob"):
        TrainConfig(algo={"name": "repo-r", "zeta_maxx": 1.0})


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


def test_bandit_applies_nested_knobs_to_the_presets_that_have_them() -> None:
    from entrogym.commands.options import parse_options

    opts = parse_options(
        bandit.build_parser(),
        ["--algos", "grpo,repo-r", "--algo.zeta-max", "0.5", "--algo.epochs", "1"],
        bandit.BanditOptions,
    )
    lab = opts.lab()
    assert lab.algorithm("repo-r").zeta_max == 0.5 and lab.algorithm("repo-r").epochs == 1
    assert lab.algorithm("grpo").epochs == 1 and lab.algorithm("grpo") != ALGORITHMS["grpo"]
    opts = parse_options(
        bandit.build_parser(), ["--algos", "grpo", "--algo.zeta-max", "0.5"], bandit.BanditOptions
    )
    with pytest.raises(ValueError, match="algo.zeta_max is a knob of none of the chosen presets"):
        opts.lab()


def test_bandit_cli_rejects_a_knob_no_preset_has(capsys) -> None:
    assert bandit.cli(["--algos", "rloo", "--algo.eps-high-max", "0.3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "eps_high_max" in err


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
