"""A broken env inside a training run: failed episodes are counted in the metrics row and
left out of the batch, and past ``max_env_error_fraction`` the run stops naming the failure
(issue: reliability, finding 2). Also the opt-in sampler self-check's row fields."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
from vowel_env import TINY_SETTINGS

from entrogym.agents.episode import EnvErrorBudgetExceeded
from entrogym.algos import get_algorithm
from entrogym.envs import UnicodeText
from entrogym.train.config import TrainConfig
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.trainer import train

# a cut turn (on_turn_budget "step") still reaches env.step
TINY = TINY_SETTINGS | dict(iterations=1, tasks_per_iter=4, max_context_tokens=128)


class HalfBroken(gym.Env):
    """Tasks t0..t3; on t0 ``step`` raises, the others end with a graded reward."""

    def __init__(self) -> None:
        self.observation_space = UnicodeText(1000)
        self.action_space = UnicodeText(100_000, min_length=1)
        self.task = ""

    def task_ids(self, split: str | None = None) -> list[str]:
        return ["t0", "t1", "t2", "t3"]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.task = (options or {})["task_id"]
        return f"Task {self.task}. Say a word.", {}

    def step(self, action: str):
        if self.task == "t0":
            raise ConnectionError("grader service unreachable")
        reward = float(len(action) % 2)
        return "done", reward, True, False, {"success": reward == 1.0}


gym.register("test/HalfBroken-v0", entry_point=HalfBroken)


def test_env_errors_are_counted_and_excluded(tmp_path, capsys) -> None:
    out = train(
        TrainConfig(
            env="test/HalfBroken-v0",
            algo=get_algorithm("rloo"),
            out=str(tmp_path),
            sampler_entropy_check=True,
            **TINY,
        )
    )
    (row,) = [r for r in read_metrics(out) if r["kind"] == "train"]
    assert row["env_errors"] == 2  # both samples of t0
    assert row["episodes"] == 6  # t0's episodes are not in the batch
    assert "grader service unreachable" in capsys.readouterr().err
    # the self-check's fields are there and finite (the hf engine samples the full softmax)
    assert math.isfinite(row["sampler_entropy_gap"]) and math.isfinite(row["sampler_entropy_z"])


def test_too_many_env_errors_stop_the_run(tmp_path) -> None:
    cfg = TrainConfig(
        env="test/HalfBroken-v0",
        algo=get_algorithm("rloo"),
        out=str(tmp_path),
        max_env_error_fraction=0.1,
        **TINY,
    )
    with pytest.raises(EnvErrorBudgetExceeded, match="test/HalfBroken-v0.*t0.*unreachable"):
        train(cfg)
