"""``entrogym train`` end to end on tiny-random-llama: nested knobs reach the run, the in-run
evaluation defaults to the held-out split and its rows carry ``split`` and ``accuracy``."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from entrogym.commands.train import cli

QUICK = [
    "--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32",
    "--iterations", "1", "--tasks-per-iter", "2", "--samples", "2",
    "--early-stop-min-per-task", "2", "--max-response-tokens", "4",
]  # fmt: skip


def test_train_with_nested_knobs_and_held_out_eval(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = [
        *QUICK,
        "--env",
        "entrogym/Arithmetic-v0",
        "--env-kwargs",
        "{num_train: 8, num_test: 4}",
    ]
    argv += ["--algo", "repo-r", "--algo.zeta-max", "0.5", "--algo.epochs", "1"]
    argv += ["--eval-env", "entrogym/Arithmetic-v0", "--eval-every", "1", "--eval-tasks", "2"]
    assert cli([*argv, "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("kind") == "eval"]
    assert evals and all(r["split"] == "test" for r in evals)  # held out, not train
    assert all(r["accuracy"] == r["pass@1"] for r in evals)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["algo"] == {"name": "repo-r", "zeta_max": 0.5, "epochs": 1}
