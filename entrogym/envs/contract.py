"""What a text env provides, as a :class:`typing.Protocol`, and the per-step checks of it.

:class:`entrogym.envs.TextEnv` implements the whole contract; a plain ``gymnasium.Env`` can too.
:func:`entrogym.envs.check_text_env` checks an env against it, and the rollout loop
(:mod:`entrogym.agents.rollout`) applies :func:`observation_problem` and :func:`reward_problem`
to every step, turning a violation into a failed episode instead of training data.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym

__all__ = [
    "DEFAULT_REWARD_RANGE",
    "EnvContractError",
    "TextEnvProtocol",
    "check_reply",
    "check_reward_range",
    "check_terminal_reward",
    "observation_problem",
    "reward_problem",
]

# Verifiable rewards (the paper's setting: a correct answer, passing unit tests) lie in [0, 1].
# An env whose rewards lie elsewhere declares its own ``reward_range``.
DEFAULT_REWARD_RANGE: tuple[float, float] = (0.0, 1.0)


class EnvContractError(ValueError):
    """An env returned something the text-env contract rules out (a non-string observation,
    a reward that is not finite or lies outside the env's ``reward_range``)."""


@runtime_checkable
class TextEnvProtocol(Protocol):
    """The text-env contract that entrogym's rollouts, trainer and eval rely on.

    - ``observation_space`` and ``action_space`` are ``gymnasium.spaces.Text``; every
      observation is a ``str``, every action a non-empty ``str``.
    - ``task_ids(split=None)`` lists the tasks of a split in a fixed order: the same list on
      every call (the trainer groups the K samples of a task by its id).
    - ``reset(seed=..., options={"task_id": tid})`` starts task ``tid``; the same task id gives
      the same first observation (the prompt), whatever the seed.
    - Rewards are terminal: ``step`` returns 0 until the episode ends; the last step's reward
      lies within ``reward_range`` (finite; default :data:`DEFAULT_REWARD_RANGE`) and its
      ``info["success"]`` is a bool.
    - ``end_episode()`` ends the episode in progress early (the agent's context is full) and
      returns ``(reward, info)`` with ``info["success"]``; afterwards ``step`` and
      ``end_episode`` raise until the next ``reset``.
    - Action truncation: when the agent cut an action at its token budget it calls
      ``flag_action_truncated()`` before ``step``, and that step's info has
      ``action_truncated=True``.

    The rollout loop reaches the non-Gymnasium members through ``env.get_wrapper_attr``, so an
    env wrapped in Gymnasium wrappers keeps them. It tolerates an env without ``end_episode``
    (a full context then scores a failure), ``flag_action_truncated`` or ``reward_range``
    (the default applies); :func:`entrogym.envs.check_text_env` does not.
    """

    observation_space: gym.spaces.Space
    action_space: gym.spaces.Space
    reward_range: tuple[float, float]

    def task_ids(self, split: str | None = None) -> list[str]: ...

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]: ...

    def end_episode(self) -> tuple[float, dict[str, Any]]: ...

    def flag_action_truncated(self) -> None: ...

    def close(self) -> None: ...


def observation_problem(observation: Any) -> str | None:
    """What is wrong with ``observation`` under the contract, or None."""
    if not isinstance(observation, str):
        return f"observation is a {type(observation).__name__}, not a str"
    return None


def reward_problem(reward: Any, reward_range: tuple[float, float]) -> str | None:
    """What is wrong with a terminal ``reward`` under the contract, or None."""
    try:
        value = float(reward)
    except (TypeError, ValueError):
        return f"reward {reward!r} is not a number"
    if not math.isfinite(value):
        return f"reward {value} is not finite"
    low, high = reward_range
    if not low <= value <= high:
        return (
            f"reward {value:g} is outside the env's reward_range ({low:g}, {high:g}); "
            "declare the range the env's rewards lie in as its reward_range"
        )
    return None


def check_reward_range(reward_range: Any) -> tuple[float, float]:
    """``reward_range`` as a ``(low, high)`` pair of floats; ValueError naming it otherwise."""
    try:
        low, high = (float(x) for x in reward_range)
    except (TypeError, ValueError) as e:
        raise ValueError(f"reward_range must be a (low, high) pair, got {reward_range!r}") from e
    if math.isnan(low) or math.isnan(high) or not low < high:
        raise ValueError(f"reward_range must have low < high, got {reward_range!r}")
    return low, high


def check_reply(observation: Any, info: Any) -> None:
    """:class:`EnvContractError` unless ``observation`` is a str and ``info`` a dict."""
    problem = observation_problem(observation)
    if problem is None and not isinstance(info, dict):
        problem = f"info is a {type(info).__name__}, not a dict"
    if problem is not None:
        raise EnvContractError(problem)


def check_terminal_reward(reward: Any, reward_range: Any = None) -> None:
    """:class:`EnvContractError` unless ``reward`` is finite and within ``reward_range``
    (None: :data:`DEFAULT_REWARD_RANGE`)."""
    bounds = check_reward_range(DEFAULT_REWARD_RANGE if reward_range is None else reward_range)
    problem = reward_problem(reward, bounds)
    if problem is not None:
        raise EnvContractError(problem)
