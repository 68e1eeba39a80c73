"""Env outputs are checked where they cross into the rollout (findings 3, 6 and 7).

- ``info["success"]`` must be a bool (Python or numpy): the string ``"False"`` once counted as
  solved, so success_rate was 1.0 with every reward 0.
- A reward must be a real number: the string ``"1.0"`` was taken as 1.
- Rewards are terminal: a non-zero reward before the last step was silently dropped; it is an
  env error now (docs/envs.md, "Rewards").
- An observation that is not valid UTF-8 text (a lone surrogate) crashed the run in the
  tokenizer, naming neither env nor task; it fails its episode now.

Each runs in the env worker processes (the default) and in this process (``env_workers=0``).
"""

from __future__ import annotations

import hostile_envs  # noqa: F401  (registers faults/Hostile-v0)
import numpy as np
import pytest
from vowel_env import TINY_SETTINGS

from entrogym.agents.rollout import collect_rollouts
from entrogym.algos import get_algorithm
from entrogym.train.config import TrainConfig
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.trainer import train

ENV = "faults/Hostile-v0"


CASES = [
    ("success-string", "step: EnvContractError: info['success'] is a str ('False'), not a bool"),
    ("string-reward", "step: EnvContractError: reward '1.0' is a str, not a real number"),
    (
        "early-reward",
        "step: EnvContractError: reward 1 before the episode's last step; rewards are "
        "terminal (every step before the last returns 0) unless the run takes per-turn "
        "rewards (--turn-rewards)",
    ),
    (
        "surrogate",
        "reset: EnvContractError: observation is not valid UTF-8 text "
        "(lone surrogate '\\ud800' at character 9)",
    ),
    (
        "surrogate-step",
        "step: EnvContractError: observation is not valid UTF-8 text "
        "(lone surrogate '\\udcff' at character 4)",
    ),
]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("fault", "message"), CASES)
def test_a_bad_env_output_fails_its_episode_naming_env_and_task(
    engine, agent, capfd, workers: int, fault: str, message: str
) -> None:
    eps = collect_rollouts(
        ENV,
        ["t0", "t1"],
        engine,
        agent,
        k=2,
        early_stop=False,
        env_kwargs={"fault": fault},
        env_workers=workers,
    )
    failed = [e for e in eps if e.failed]
    assert [e.task_id for e in failed] == ["t0", "t0"], [e.error for e in eps]
    for e in failed:
        assert e.error == f"env {ENV!r}, task 't0', {message}"
        assert e.reward == 0.0 and e.info["success"] is False
    assert eps.stats["env_errors"] == 2
    assert all(not e.failed for e in eps if e.task_id == "t1")


def test_success_flags_of_numpy_and_python_bools_pass() -> None:
    from entrogym.envs.contract import check_success_flag

    for ok in (True, False, np.bool_(True), np.False_):
        check_success_flag({"success": ok})
    check_success_flag({})  # no flag: the reward decides
    for bad in ("False", 1, 0.0, None, [True]):
        with pytest.raises(ValueError, match=r"info\['success'\] is a"):
            check_success_flag({"success": bad})


def test_a_string_success_flag_does_not_count_as_solved_in_training(tmp_path) -> None:
    out = train(
        TrainConfig(
            env=ENV,
            env_kwargs={"fault": "success-string", "broken": ["t0", "t1"]},
            algo=get_algorithm("rloo"),
            iterations=1,
            out=str(tmp_path),
            **{**TINY_SETTINGS, "tasks_per_iter": 4},
        )
    )
    (row,) = read_metrics(out)
    assert row["env_errors"] == 4 and row["episodes"] == 4
    # the four counted episodes are t2's and t3's: solved exactly when their reward is 1
    assert row["success_rate"] == pytest.approx(row["reward_mean"])
