"""``entrogym train`` end to end on tiny-random-llama: algorithm options reach the run, every
lever and controller trains on the LLM path, the in-run evaluation defaults to the held-out
split and its rows carry ``split`` and ``accuracy``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from entrogym.algos import algorithm_mapping
from entrogym.commands.train import cli
from entrogym.train.folder.safety import saved_algorithm

QUICK = [
    "--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32",
    "--iterations", "1", "--tasks-per-iter", "2", "--samples", "2",
    "--early-stop-min-per-task", "2", "--max-response-tokens", "4",
]  # fmt: skip


def test_train_with_algorithm_options_and_held_out_eval(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = [
        *QUICK,
        "--env",
        "entrogym/Arithmetic-v0",
        "--env-kwargs",
        "{num_train: 8, num_test: 4}",
    ]
    argv += ["--algo", "repo-r", "--algo.controller.max", "0.5", "--algo.epochs", "1"]
    argv += ["--eval-env", "entrogym/Arithmetic-v0", "--eval-every", "1", "--eval-tasks", "2"]
    assert cli([*argv, "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("kind") == "eval"]
    assert evals and all(r["split"] == "test" for r in evals)  # held out, not train
    assert all(r["accuracy"] == r["pass@1"] for r in evals)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    # the whole algorithm's mapping, the options given among its values
    assert saved["algo"] == algorithm_mapping(saved_algorithm(saved))
    assert (saved["algo"]["controller"]["max"], saved["algo"]["epochs"]) == (0.5, 1)


@pytest.mark.parametrize(
    ("options", "coefficient", "share"),
    [
        (["--algo", "repo-d", "--algo.controller", "pi", "--algo.lever.centering", "exact"], "zeta", None),
        (["--algo", "kl-cov", "--algo.lever.kl-cov-ratio", "0.2"], "kl_coef", "kl_cov_share"),
        (["--algo", "clip-cov", "--algo.lever.lb", "-100", "--algo.controller.init", "0.2"],
         "clip_cov_ratio", "clip_cov_share"),
        (["--algo", "grpo-adaptive-entropy", "--algo.mask", "high-entropy"], "beta", "token_mask_share"),
        (["--algo", "adapo", "--algo.controller", "additive", "--algo.controller.step", "optimizer"],
         "eps_high", None),
        (["--algo", "grpo", "--algo.lever", "entropy-constraint", "--algo.lever.rows", "mixed",
          "--algo.controller.target-probe", "1"], "beta", None),
    ],
)  # fmt: skip
def test_every_lever_and_controller_trains_through_the_command(
    tmp_path: Path, options: list[str], coefficient: str, share: str | None
) -> None:
    out = tmp_path / "run"
    env = ["--env", "entrogym/Arithmetic-v0", "--env-kwargs", "{num_train: 8, num_test: 4}"]
    argv = [*QUICK, *env, "--iterations", "2", "--samples", "3", "--max-response-tokens", "6"]
    assert cli([*argv, *options, "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("kind", "train") == "train"]
    assert len(train) == 2
    for row in train:
        assert row[coefficient] is not None and row["entropy_target"] > 0
        tracked = row["entropy_tracked"]  # the controller's estimate (controller.estimator)
        assert row["entropy_error"] == pytest.approx(tracked / row["entropy_target"] - 1)
        if share is not None:
            assert 0 < row[share] <= 1  # the token-selecting part touched some tokens
