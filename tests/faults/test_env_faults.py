"""Broken envs fail their episodes, loudly (issue: reliability, finding 2; contract C3).

Each env below breaks one promise of the text-env contract inside a real rollout (the ``hf``
engine on the tiny random Llama): its episodes come back failed, with the env id, the task id
and the message; the message reaches stderr once; ``stats["env_errors"]`` counts them; and
``check_env_errors`` stops a run whose failed share is too high, naming the first failure.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import pytest

from entrogym.agents.rollout import EnvErrorBudgetExceeded, check_env_errors, collect_rollouts
from entrogym.envs import UnicodeText


class Faulty(gym.Env):
    """A plain Gymnasium text env; on the tasks in ``broken`` its ``step`` does ``fault``."""

    def __init__(self, fault: str, broken: tuple[str, ...] = ("t0", "t1"), **attrs: Any) -> None:
        self.fault, self.broken, self.task = fault, broken, ""
        self.observation_space = UnicodeText(1000)
        self.action_space = UnicodeText(100_000, min_length=1)
        self.__dict__.update(attrs)

    def task_ids(self, split: str | None = None) -> list[str]:
        return ["t0", "t1"]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.task = (options or {})["task_id"]
        return f"Task {self.task}. Say anything.", {}

    def step(self, action: str):
        if self.task not in self.broken:
            return "fine", 1.0, True, False, {"success": True}
        if self.fault == "raise":
            raise ConnectionError("grader service unreachable")
        if self.fault == "non-string":
            return {"text": "not a string"}, 1.0, True, False, {"success": True}
        reward = {"huge": 1e6, "nan": math.nan, "inf": -math.inf}[self.fault]
        return "done", reward, True, False, {"success": False}


def _collect(engine, agent, fault: str, **kwargs: Any):
    return collect_rollouts(
        lambda: Faulty(fault, **kwargs), ["t0", "t1"], engine, agent, k=2, early_stop=False
    )


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("raise", "step: ConnectionError: grader service unreachable"),
        ("non-string", "step: EnvContractError: observation is a dict, not a str"),
        (
            "huge",
            "step: EnvContractError: reward 1e+06 is outside the env's reward_range (0, 1); "
            "declare the range the env's rewards lie in as its reward_range",
        ),
        ("nan", "step: EnvContractError: reward nan is not finite"),
        ("inf", "step: EnvContractError: reward -inf is not finite"),
    ],
)
def test_broken_env_fails_its_episodes_with_a_named_error(
    engine, agent, capfd: pytest.CaptureFixture[str], fault: str, message: str
) -> None:
    eps = _collect(engine, agent, fault)
    assert len(eps) == 4 and eps.stats["env_errors"] == 4
    for e in eps:
        assert e.failed and e.reward == 0.0 and e.info["success"] is False
        assert e.error == f"env 'Faulty', task {e.task_id!r}, {message}"
        assert e.num_action_tokens == 3  # the episode's tokens are kept, for inspection
    assert eps.stats["env_error_messages"] == [f"Faulty: {message}"]
    logged = [line for line in capfd.readouterr().err.splitlines() if message in line]
    assert len(logged) == 1, logged  # once per distinct message, not once per episode
    assert "episode failed on an env error" in logged[0]
    with pytest.raises(EnvErrorBudgetExceeded, match="4 of 4 episodes failed"):
        check_env_errors(eps, 0.5)


def test_declared_reward_range_is_honoured(engine, agent) -> None:
    eps = _collect(engine, agent, "huge", reward_range=(0.0, 1e7))
    assert eps.stats["env_errors"] == 0 and sorted(e.reward for e in eps) == [1e6] * 4


def test_error_budget_names_the_first_failure(engine, agent) -> None:
    eps = _collect(engine, agent, "raise", broken=("t1",))
    assert [e.failed for e in eps] == [False, False, True, True]
    assert eps.stats["env_errors"] == 2 and eps.stats["mean_reward"] == 1.0
    check_env_errors(eps, 0.5)  # 2 of 4 is not above one half
    with pytest.raises(EnvErrorBudgetExceeded) as caught:
        check_env_errors(eps, 0.25)
    assert str(caught.value) == (
        "2 of 4 episodes failed on env errors, more than max_env_error_fraction=0.25; the "
        "first: env 'Faulty', task 't1', step: ConnectionError: grader service unreachable"
    )
    assert isinstance(caught.value, RuntimeError)
    for bad in (-0.1, 1.5, "half"):
        with pytest.raises(ValueError, match="max_fraction"):
            check_env_errors(eps, bad)  # type: ignore[arg-type]
