"""``entrogym demo``: labelled variants, --seed, the goal's verdict and the sweep's cells."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.demo_sweep import cell_name, logged_coefficient, parse_cell
from entrogym.commands.demo import DemoOptions, build_parser
from entrogym.commands.demo import cli as demo_cli
from entrogym.commands.demo_runs import parse_run
from entrogym.commands.options import parse_options
from entrogym.experiments import DEFAULT_ITERATIONS, DEFAULT_RUNS, demo_config


def test_a_variant_is_labelled_and_keeps_the_presets_other_values(tmp_path: Path) -> None:
    run = parse_run("repo-r --algo.controller.init=0.05  --algo.controller.max 0.5")
    label, folder = run.label, run.folder
    assert label == "repo-r --algo.controller.init 0.05 --algo.controller.max 0.5"
    assert folder == "repo-r_controller.init_0.05_controller.max_0.5"
    cfg = demo_config(run.algo, tmp_path, 15, 1e-3, 40, seed=3, engine="hf", name=folder)
    resolved = cfg.algo
    assert (resolved.controller.params.init, resolved.controller.params.max) == (0.05, 0.5)
    assert resolved.controller.params.min is None  # the lever's 1e-4, as the preset
    assert (cfg.seed, cfg.engine, Path(cfg.out).name) == (3, "hf", folder)
    plain = parse_run("repo-r")
    assert (plain.label, plain.folder, plain.algo.name) == ("repo-r", "repo-r", "repo-r")
    assert demo_config(plain.algo, tmp_path, 15, 1e-3, 40).algo.controller.name == "paper"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("grpo --algo.controller pi", "presets with a lever: repo-r"),
        ("repo-r --algo.controller.max", "needs a value"),
        ("ppo", "ppo"),
        ("repo-r --algo.lever.centering fancy", "raw, exact"),
        ("repo-r --algo.lever nope", "registered levers: none, repo-r"),
        ("repo-d --algo.controller pid", "registered controllers"),
        ("repo-d --algo.controller pi --algo.controller.kq 1", "its knobs: target"),
    ],
)
def test_bad_runs_are_refused_naming_the_problem(spec: str, needle: str, capsys) -> None:
    assert demo_cli(["--algos", spec]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_defaults_meet_the_issue_floor_and_seed_is_an_option() -> None:
    opts = parse_options(build_parser(), ["--seeds", "7", "8", "--workers", "1"], DemoOptions)
    assert opts.seeds == [7, 8] and opts.workers == 1
    assert opts.iterations == DEFAULT_ITERATIONS >= 15
    with pytest.raises(ValueError, match="distinct"):
        DemoOptions(seeds=[1, 1])
    with pytest.raises(ValueError, match="workers"):
        DemoOptions(workers=999)
    assert {parse_run(s).algo.name for s in DEFAULT_RUNS} >= {"grpo", "repo-r"}
    with pytest.raises(ValueError, match="engine"):
        DemoOptions(engine="tpu")
    variant = "repo-d --algo.controller pi"
    assert DemoOptions(algos=[f"grpo,{variant}", "adapo"]).algos == ["grpo", variant, "adapo"]


def test_sweep_cells_parse_and_name_uniquely() -> None:
    cell = parse_cell(
        "repo-d --algo.controller pi --algo.controller.kp 0.3 --lr 5e-4 --iters 20 --seed 1"
    )
    assert cell["algo"] == "repo-d --algo.controller pi --algo.controller.kp 0.3"
    assert (cell["lr"], cell["iters"], cell["seed"], cell["engine"]) == (5e-4, 20, 1, "hf")
    other = parse_cell("repo-d --algo.controller pi --algo.controller.kp 0.3 --lr 5e-4 --iters 20")
    assert cell_name(cell) != cell_name(other)
    with pytest.raises(ValueError, match="is not one of --lr"):
        parse_cell("grpo --lr")
    # a bf16 sampler is its own cell; an fp32 one keeps the name it had before the key existed
    bf16 = parse_cell("grpo --lr 5e-4 --engine-dtype bf16")
    assert bf16["engine_dtype"] == "bf16" and cell_name(bf16).endswith("_hf_bf16")
    assert cell_name(parse_cell("grpo --lr 5e-4")).endswith("_hf")


def test_the_demo_config_takes_another_sampler_dtype(tmp_path) -> None:
    from entrogym.commands.demo_runs import parse_run
    from entrogym.experiments.config import demo_config

    algo = parse_run("grpo").algo
    assert demo_config(algo, tmp_path, 2, 1e-3, 0).engine_dtype == "fp32"
    config = demo_config(algo, tmp_path, 2, 1e-3, 0, engine_dtype="fp16")
    assert (config.engine_dtype, config.dtype) == ("fp16", "fp32")


def test_the_sweep_records_each_levers_own_coefficient() -> None:
    # every lever's coefficient by its registered name, EntroPIC's and AEPO's among them
    row = {"alpha": -0.2, "temperature": 1.2, "beta": 0.01, "eps_high": 0.28, "zeta": 1e-3}
    assert logged_coefficient("entropic", row) == "alpha"
    assert logged_coefficient("aepo", row) == "temperature"
    assert logged_coefficient("entropy-constraint", row) == "beta"
    assert logged_coefficient("clip-high", row) == "eps_high"
    assert logged_coefficient("repo-r", row) == "zeta"
    # the plain presets have none; a coefficient the row did not log is not claimed
    assert logged_coefficient("none", row) is None
    assert logged_coefficient("kl-cov", row) is None
