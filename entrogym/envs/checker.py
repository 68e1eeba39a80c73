"""``check_text_env(env)``: the text-env contract (:mod:`entrogym.envs.contract`), checked.

In the style of Gymnasium's ``utils/env_checker.py``: small ``check_*`` functions, each for one
promise of the contract, run by :func:`check_text_env` on the first few tasks of a split. A
failure is a :class:`TextEnvCheckError` saying which check failed, on which task id, and why.
Gymnasium's own ``check_env`` covers the Gymnasium API (spaces, seeding, return types); this
covers what entrogym adds on top of it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from entrogym.envs.contract import (
    EnvContractError,
    check_reward_range,
    check_step_reward,
    check_terminal_reward,
    observation_problem,
)

__all__ = [
    "TextEnvCheckError",
    "check_action_truncation",
    "check_end_episode",
    "check_episode_rewards",
    "check_prompt_is_stable",
    "check_task_ids_stable",
    "check_text_env",
    "check_text_spaces",
    "check_turn_limit",
]

DEFAULT_MAX_STEPS = 100  # an episode that has not ended by then is ended with end_episode()


class TextEnvCheckError(ValueError):
    """A failed check: ``check`` names it, ``task_id`` is the task it failed on (or None)."""

    def __init__(self, check: str, task_id: str | None, detail: str) -> None:
        self.check, self.task_id, self.detail = check, task_id, detail
        where = f" on task {task_id!r}" if task_id is not None else ""
        super().__init__(f"{check} failed{where}: {detail}")


def _attr(env: gym.Env, name: str, check: str) -> Any:
    try:
        return env.get_wrapper_attr(name)
    except AttributeError:
        raise TextEnvCheckError(
            check, None, f"the env has no {name!r} (subclass entrogym.envs.TextEnv)"
        ) from None


def _fail(check: str, task_id: str | None, detail: str) -> TextEnvCheckError:
    return TextEnvCheckError(check, task_id, detail)


def _call(check: str, task_id: str, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; an exception becomes a failure of ``check`` on ``task_id``."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - report which check and task it broke
        raise _fail(check, task_id, f"{what} raised {type(e).__name__}: {e}") from e


def _reset(env: gym.Env, task_id: str, check: str, seed: int) -> str:
    observation, _ = _call(check, task_id, "reset", env.reset, seed=seed,
                           options={"task_id": task_id})  # fmt: skip
    problem = observation_problem(observation)
    if problem is not None:
        raise _fail(check, task_id, f"reset: {problem}")
    return observation


def _outcome(
    check: str, task_id: str, where: str, reward: Any, reward_range: Any, info: Any = None
) -> None:
    """The contract's reward checks (:mod:`entrogym.envs.contract`) as a failure of ``check``:
    a terminal outcome when ``info`` is given, else a step before the last."""
    try:
        if info is None:
            check_step_reward(reward, False)
        else:
            check_terminal_reward(reward, reward_range, info)
    except EnvContractError as e:
        raise _fail(check, task_id, f"{where}: {e}") from e


def check_text_spaces(env: gym.Env) -> None:
    """Text observation and action spaces, ``task_ids``, and a valid ``reward_range``."""
    check = "check_text_spaces"
    for name in ("observation_space", "action_space"):
        if not isinstance(getattr(env, name, None), gym.spaces.Text):
            raise _fail(check, None, f"{name} must be a gymnasium.spaces.Text")
    if not callable(_attr(env, "task_ids", check)):
        raise _fail(check, None, "task_ids must be a method task_ids(split=None)")
    try:
        check_reward_range(_attr(env, "reward_range", check))
    except ValueError as e:
        raise _fail(check, None, str(e)) from e


def check_turn_limit(env: gym.Env) -> None:
    """An env whose class declares ``max_turns`` above 1 allows more than one turn: an
    instance cut to 1 (a constructor that passes ``max_turns=1`` over the declaration) would
    end every episode at its first action, as a single-turn env."""
    check = "check_turn_limit"
    inner = env.unwrapped
    declared = next(
        (c.__dict__["max_turns"] for c in type(inner).__mro__ if "max_turns" in vars(c)), None
    )
    try:
        allowed = env.get_wrapper_attr("max_turns")
    except AttributeError:
        return
    if isinstance(declared, int) and declared > 1 and allowed == 1:
        raise _fail(
            check,
            None,
            f"{type(inner).__name__} declares max_turns = {declared}, but its episodes end "
            "after 1 turn (its constructor passed max_turns=1 to TextEnv); drop that argument "
            "or declare max_turns = 1",
        )


def check_task_ids_stable(env: gym.Env, split: str | None = None) -> list[str]:
    """``task_ids(split)`` is a non-empty list of distinct strings, the same on every call."""
    check = "check_task_ids_stable"
    task_ids = _attr(env, "task_ids", check)
    first = task_ids(split)
    if not isinstance(first, list) or not first or not all(isinstance(t, str) for t in first):
        raise _fail(check, None, f"task_ids({split!r}) must be a non-empty list of str")
    if len(set(first)) != len(first):
        raise _fail(check, None, f"task_ids({split!r}) repeats a task id")
    if list(task_ids(split)) != first:
        raise _fail(check, None, f"task_ids({split!r}) changed between two calls")
    return list(first)


def check_prompt_is_stable(env: gym.Env, task_id: str, seed: int = 0) -> None:
    """The same task id gives the same first observation, whatever the reset seed."""
    check = "check_prompt_is_stable"
    first = _reset(env, task_id, check, seed)
    again = _reset(env, task_id, check, seed + 1)
    if again != first:
        raise _fail(check, task_id, "two resets to the same task gave different prompts")


def check_episode_rewards(
    env: gym.Env, task_id: str, seed: int = 0, max_steps: int = DEFAULT_MAX_STEPS
) -> None:
    """An episode of sampled actions: reward 0 before the terminal step; a terminal reward
    within ``reward_range`` with a bool ``info["success"]``; string observations throughout."""
    check = "check_episode_rewards"
    reward_range = check_reward_range(_attr(env, "reward_range", check))
    _reset(env, task_id, check, seed)
    env.action_space.seed(seed)
    for turn in range(1, max_steps + 1):
        step = _call(check, task_id, f"step {turn}", env.step, _action(env))
        observation, reward, terminated, truncated, info = step
        problem = observation_problem(observation)
        if problem is not None:
            raise _fail(check, task_id, f"step {turn}: {problem}")
        if not (terminated or truncated):
            _outcome(check, task_id, f"step {turn}", reward, reward_range)
            continue
        _outcome(check, task_id, f"terminal step {turn}", reward, reward_range, info)
        return
    # a long episode: end it, so the env is left between episodes
    _call(check, task_id, "end_episode", _attr(env, "end_episode", check))


def check_end_episode(env: gym.Env, task_id: str, seed: int = 0) -> None:
    """``end_episode()`` ends the episode in progress: it returns a reward within
    ``reward_range`` and ``info["success"]``, and then ``step`` and ``end_episode`` refuse."""
    check = "check_end_episode"
    end_episode = _attr(env, "end_episode", check)
    reward_range = check_reward_range(_attr(env, "reward_range", check))
    _reset(env, task_id, check, seed)
    reward, info = _call(check, task_id, "end_episode", end_episode)
    _outcome(check, task_id, "end_episode", reward, reward_range, info)
    for name, call in (("step", lambda: env.step(_action(env))), ("end_episode", end_episode)):
        try:
            call()
        except Exception:  # noqa: BLE001 - any clear refusal will do
            continue
        raise _fail(check, task_id, f"{name} after end_episode() did not raise: not ended")


def check_action_truncation(env: gym.Env, task_id: str, seed: int = 0) -> None:
    """After ``flag_action_truncated()`` the next step's info has ``action_truncated=True``."""
    check = "check_action_truncation"
    flag = _attr(env, "flag_action_truncated", check)
    _reset(env, task_id, check, seed)
    _call(check, task_id, "flag_action_truncated", flag)
    _, _, terminated, truncated, info = _call(check, task_id, "step", env.step, _action(env))
    if not isinstance(info, dict) or info.get("action_truncated") is not True:
        raise _fail(check, task_id, "the step after flag_action_truncated() lacks "
                    "info['action_truncated'] = True")  # fmt: skip
    if not (terminated or truncated):
        _call(check, task_id, "end_episode", _attr(env, "end_episode", check))


def _action(env: gym.Env) -> str:
    """A sampled action (a non-empty string: the contract's actions are never empty)."""
    action = env.action_space.sample()
    return action if action else "a"


def check_text_env(
    env: gym.Env,
    *,
    split: str | None = None,
    max_tasks: int = 2,
    seed: int = 0,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> None:
    """Check ``env`` (wrapped or not) against the text-env contract on the first ``max_tasks``
    tasks of ``split`` (the env's default split when None); raises :class:`TextEnvCheckError`.

    The episodes use sampled actions (``env.action_space.sample()``, seeded with ``seed``), so
    they check the contract, not the task's difficulty. The env is left after an ended episode.
    """
    if not isinstance(max_tasks, int) or max_tasks < 1:
        raise ValueError(f"max_tasks must be a positive integer, got {max_tasks!r}")
    check_text_spaces(env)
    check_turn_limit(env)
    task_ids = check_task_ids_stable(env, split)
    for task_id in task_ids[:max_tasks]:
        check_prompt_is_stable(env, task_id, seed)
        check_episode_rewards(env, task_id, seed, max_steps)
        check_end_episode(env, task_id, seed)
        check_action_truncation(env, task_id, seed)
    if check_task_ids_stable(env, split) != task_ids:
        raise _fail("check_task_ids_stable", None, "task_ids changed after episodes were run")
