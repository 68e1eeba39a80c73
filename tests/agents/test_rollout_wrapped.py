"""Rollouts of envs wrapped in Gymnasium wrappers: the loop reaches ``end_episode``,
``flag_action_truncated`` and ``reward_range`` through ``env.get_wrapper_attr``."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest
from gymnasium.wrappers import RecordEpisodeStatistics, TimeLimit, TransformReward

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import make_engine
from entrogym.agents.rollout import collect_rollouts
from entrogym.envs import TextEnv, Turn, check_text_env

MODEL = "tiny-random-llama"


class Talk(TextEnv):
    """``turns`` turns, reward 1 at the end; cut short, the env scores 0.25."""

    splits = ("train",)

    def __init__(self, turns: int = 2) -> None:
        super().__init__(max_turns=50)
        self.turns = turns

    def task_ids(self, split: str | None = None) -> list[str]:
        return ["t0", "t1"]

    def _start_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        return f"Task {task_id}. Say anything.", {}

    def _respond(self, action: str) -> Turn:
        done = self._turn + 1 >= self.turns
        return Turn("x " * 40, done=done, reward=1.0, success=done)

    def _on_truncate(self) -> Turn:
        return Turn(done=True, reward=0.25, info={"scored_at_end": True})


class Doubled(gym.Wrapper):
    """Doubles the reward and says so in its own ``reward_range``."""

    reward_range = (0.0, 2.0)

    def step(self, action: str):
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, 2 * reward, terminated, truncated, info


@pytest.fixture(scope="module")
def engine():
    eng = make_engine("hf", MODEL, dtype="fp32", max_model_len=256, seed=0)
    yield eng
    eng.close()


def test_wrapped_env_keeps_the_text_env_contract(engine) -> None:
    agent = LLMAgent.from_model(MODEL, max_turn_tokens=3, max_context=256, on_turn_budget="step")
    wrapped = lambda: RecordEpisodeStatistics(TimeLimit(Talk(turns=2), 10))  # noqa: E731
    check_text_env(wrapped(), max_tasks=1)
    eps = collect_rollouts(wrapped, ["t0", "t1"], engine, agent, k=2, early_stop=False)
    assert eps.stats["env_errors"] == 0 and len(eps) == 4
    for e in eps:  # every turn was cut at 3 tokens: the env saw the flag through the wrappers
        assert e.reward == 1.0 and e.info["action_truncated"] and e.num_turns == 2
        assert e.env_id == "Talk"


def test_full_context_reaches_end_episode_through_wrappers(engine) -> None:
    agent = LLMAgent.from_model(MODEL, max_turn_tokens=3, max_context=160, on_turn_budget="step")
    wrapped = lambda: TimeLimit(TransformReward(Talk(turns=99), lambda r: r), 99)  # noqa: E731
    eps = collect_rollouts(wrapped, ["t0"], engine, agent, k=2, early_stop=False)
    for e in eps:
        assert e.info["truncated_by"] == "context" and e.info["scored_at_end"], e.info
        assert e.reward == 0.25 and not e.failed


def test_wrapper_reward_range_wins_over_the_envs(engine) -> None:
    agent = LLMAgent.from_model(MODEL, max_turn_tokens=3, max_context=256, on_turn_budget="step")
    eps = collect_rollouts(lambda: Doubled(Talk(turns=1)), ["t0"], engine, agent, k=2)
    assert eps.stats["env_errors"] == 0 and [e.reward for e in eps] == [2.0, 2.0]
    plain = collect_rollouts(lambda: Talk(turns=1), ["t0"], engine, agent, k=2)
    assert [e.reward for e in plain] == [1.0, 1.0]
