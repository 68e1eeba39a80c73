"""The trainer's eval row and ``entrogym eval`` are one evaluation: the same adapter, tasks and
seed give the same numbers (``entrogym.train.evaluation.evaluate``)."""

from __future__ import annotations

import json
from pathlib import Path

from vowel_env import TINY_SETTINGS  # registers test/Vowel-v0 (graded rewards: a strong check)

from entrogym.algos import get_algorithm
from entrogym.commands.eval import cli
from entrogym.train.config import TrainConfig
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.trainer import train

SETTINGS = TINY_SETTINGS | dict(max_response_tokens=6, max_context_tokens=128, temperature=1.0)


def test_entrogym_eval_equals_the_trainers_eval_row(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = TrainConfig(
        **SETTINGS | dict(iterations=1, lr=1e-2, seed=3),
        env="test/Vowel-v0",
        algo=get_algorithm("grpo"),
        eval_env="test/Vowel-v0",
        eval_split="train",
        eval_every=1,
        eval_tasks=3,
        eval_samples=3,
        out=str(run),
    )
    (row,) = [r for r in read_metrics(train(cfg)) if r["kind"] == "eval"]
    adapter = run / "checkpoints" / "iter-000000" / "adapter"
    argv = ["--env", "test/Vowel-v0", "--split", "train", "--model", SETTINGS["model"],
            "--engine", "hf", "--engine-dtype", "fp32", "--adapter", str(adapter),
            "--max-tasks", "3", "--samples", "3", "--seed", "3",
            "--max-response-tokens", "6", "--max-context-tokens", "128",
            "--on-turn-budget", SETTINGS["on_turn_budget"], "--out", str(tmp_path / "ev")]  # fmt: skip
    assert cli(argv) == 0
    summary = json.loads((tmp_path / "ev" / "eval.json").read_text())["summary"]
    keys = ["split", "tasks", "samples", "pass@1", "pass@3", "distinct_correct_mean",
            "reward_mean", "episodes", "env_errors", "truncated"]  # fmt: skip
    assert {k: summary[k] for k in keys} == {k: row[k] for k in keys}
    assert 0 < row["reward_mean"] < 1  # graded rewards: equal numbers mean equal samples
    # a different seed samples differently: the equality above is not a constant
    assert cli([*argv[:-2], "--seed", "4", "--out", str(tmp_path / "ev4")]) == 0
    other = json.loads((tmp_path / "ev4" / "eval.json").read_text())["summary"]
    assert other["reward_mean"] != row["reward_mean"]
