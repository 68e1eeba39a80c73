"""Eval is honest about failures (issue: reliability round two, findings 4 and 8).

- ``entrogym eval`` on a broken env: the summary counts the env errors, pass@k is computed
  over the episodes that ran, and past ``--max-env-error-fraction`` the exit code is 1.
- In-run eval rows carry ``env_errors``, and a row with errors never marks a checkpoint best.
- A random-bytes adapter and an all-NaN adapter in ``entrogym eval`` are one line naming the
  file and what to do (exit code 2), not a traceback or a 0 % policy.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_trainer_env_errors import HalfBroken  # tests/faults: the broken env of training
from vowel_env import TINY_SETTINGS

from entrogym.algos import get_algorithm
from entrogym.commands.eval import cli
from entrogym.train.config import TrainConfig
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.trainer import train

# a cut turn (on_turn_budget "step") still reaches env.step
TINY = ["--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32",
        "--max-response-tokens", "4", "--max-context-tokens", "256",
        "--on-turn-budget", "step"]  # fmt: skip


class Broken(HalfBroken):
    """HalfBroken's tasks t0..t3 as a held-out split ``test``; ``step`` raises on the tasks
    in ``broken`` and solves the others."""

    splits = ("test",)

    def __init__(self, broken: tuple[str, ...] = ("t0", "t1", "t2", "t3")) -> None:
        super().__init__()
        self.broken = tuple(broken)

    def step(self, action: str):
        if self.task in self.broken:
            raise ConnectionError("grader service unreachable")
        return "done", 1.0, True, False, {"success": True}


if "faults/Broken-v0" not in gym.registry:
    gym.register("faults/Broken-v0", entry_point=Broken)


def test_eval_past_the_error_budget_exits_nonzero_and_says_so(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ev"
    rc = cli(["--env", "faults/Broken-v0", *TINY, "--samples", "2", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 1
    err = [line for line in captured.err.splitlines() if line.startswith("entrogym eval: error")]
    assert len(err) == 1 and "8 of 8 episodes failed on env errors" in err[0]
    assert "grader service unreachable" in err[0]
    assert "env_errors=8" in captured.out  # the summary still prints, with the count
    summary = json.loads((out / "eval.json").read_text())["summary"]  # and nothing is lost
    assert summary["env_errors"] == 8 and summary["pass@1"] is None


def test_eval_under_the_budget_counts_errors_and_scores_the_rest(tmp_path: Path, capsys) -> None:
    argv = ["--env", "faults/Broken-v0", "--env-kwargs", '{"broken": ["t0"]}', *TINY]
    argv += ["--samples", "2", "--max-env-error-fraction", "0.5", "--out", str(tmp_path)]
    assert cli(argv) == 0
    printed = capsys.readouterr().out
    assert "env_errors=2" in printed
    summary = json.loads((tmp_path / "eval.json").read_text())["summary"]
    # the broken task is left out of pass@1 instead of counted as a wrong answer
    assert summary["env_errors"] == 2 and summary["pass@1"] == 1.0
    assert summary["tasks_scored"] == 3 and summary["tasks"] == 4


def test_in_run_eval_rows_carry_env_errors_and_never_mark_best(tmp_path: Path) -> None:
    cfg = TrainConfig(
        **TINY_SETTINGS | dict(iterations=1, max_context_tokens=256),
        env="test/Vowel-v0",
        algo=get_algorithm("grpo"),
        eval_env="faults/Broken-v0",
        eval_env_kwargs={"broken": ["t0"]},
        eval_every=1,
        out=str(tmp_path),
    )
    rows = read_metrics(train(cfg))
    (eval_row,) = [r for r in rows if r["kind"] == "eval"]
    assert eval_row["env_errors"] == 1 and eval_row["pass@1"] == 1.0
    assert not (tmp_path / "checkpoints" / "best").exists()  # pass@1 of a broken eval
    clean = TrainConfig(
        **{**cfg.__dict__, "eval_env_kwargs": {"broken": []}, "out": str(tmp_path / "b")}
    )
    read_metrics(train(clean))
    assert (tmp_path / "b" / "checkpoints" / "best").is_file()  # a clean eval does mark it


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> Path:
    from entrogym.train.learner.policy import load_policy, save_adapter

    folder = tmp_path_factory.mktemp("adapters") / "good"
    return save_adapter(load_policy("tiny-random-llama", seed=0), folder)


def _copy(adapter: Path, to: Path) -> Path:
    to.mkdir()
    for f in adapter.iterdir():
        (to / f.name).write_bytes(f.read_bytes())
    return to


@pytest.mark.parametrize("damage", ["random-bytes", "all-nan"])
def test_a_damaged_adapter_is_one_line_naming_the_file(
    adapter: Path, damage: str, tmp_path: Path, capsys
) -> None:
    bad = _copy(adapter, tmp_path / damage)
    weights = bad / "adapter_model.safetensors"
    if damage == "random-bytes":
        weights.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    else:
        tensors = load_file(str(weights))
        save_file({k: torch.full_like(v, float("nan")) for k, v in tensors.items()}, str(weights))
    argv = ["--env", "entrogym/Arithmetic-v0", *TINY, "--max-tasks", "1"]
    assert cli([*argv, "--adapter", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(weights) in err[0], err
    assert ("not a safetensors file" if damage == "random-bytes" else "not finite") in err[0]
    assert "checkpoint" in err[0]  # what to do: take another checkpoint's adapter
