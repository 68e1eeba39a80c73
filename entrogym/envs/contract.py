"""What a text env provides, as a :class:`typing.Protocol`, and the per-step checks of it.

:class:`entrogym.envs.TextEnv` implements the whole contract; a plain ``gymnasium.Env`` can too.
:func:`entrogym.envs.check_text_env` checks an env against it, and the rollout loop
(:mod:`entrogym.agents.rollout`) applies :func:`check_reply` and :func:`check_step_reward` to
every step, turning a violation into a failed episode instead of training data.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

__all__ = [
    "DEFAULT_REWARD_RANGE",
    "EnvContractError",
    "EvaluationHooks",
    "TextEnvProtocol",
    "check_reply",
    "check_reward_range",
    "check_step_reward",
    "check_success_flag",
    "check_terminal_reward",
    "observation_problem",
    "reward_problem",
]

# Verifiable rewards (the paper's setting: a correct answer, passing unit tests) lie in [0, 1].
# An env whose rewards lie elsewhere declares its own ``reward_range``.
DEFAULT_REWARD_RANGE: tuple[float, float] = (0.0, 1.0)


class EnvContractError(ValueError):
    """An env returned something the text-env contract rules out: an observation that is not
    UTF-8 text, a reward that is not a real number, not finite, outside the env's
    ``reward_range`` or paid before the last step, an ``info["success"]`` that is not a bool."""


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
      ``info["success"]`` is a bool. Per-turn rewards are the one exception, taken only when
      the run asks for them (``--turn-rewards``): then every step may pay a finite reward,
      and the episode's return, the sum of its steps' rewards, lies within ``reward_range``
      (:func:`check_step_reward`, :func:`check_terminal_reward` on the return).
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

    Optional members for evaluation (``eval_split``, ``on_turn_budget``,
    ``evaluation_env_kwargs``, ``evaluation_task_fields``, ``evaluation_report``) are described
    by :class:`EvaluationHooks`; an env without them is evaluated on pass@k alone.
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


class EvaluationHooks(Protocol):
    """OPTIONAL members an env may add for evaluation; each one is independent of the others.

    ``entrogym eval`` (and, for ``eval_split``, the trainer's in-run eval) reaches them with
    ``env.get_wrapper_attr(name)``, so Gymnasium wrappers keep them, and an env that lacks one
    gets the default named here. They are how env-specific evaluation (AppWorld's test
    rules, TGC/SGC and its own report) stays with the env instead of in the command.

    - ``eval_split``: the split evaluated when none is named (default: ``test``, else the first
      ``test*`` split; never train).
    - ``on_turn_budget``: ``"truncate"`` or ``"step"``, what the agent does with a turn cut at
      its token budget when the user names no rule (default ``"truncate"``: the episode ends;
      ``"step"``: the cut text is still sent to the env).
    - ``evaluation_env_kwargs(samples)``: keyword arguments for the envs of an evaluation's
      rollouts with ``samples`` per task; the user's own env kwargs win over them.
    - ``evaluation_task_fields(task_id, episodes)``: extra columns of the task's ``per_task``
      row of ``eval.json``, from its ``episodes`` (its samples, in order).
    - ``evaluation_report(results, out_dir, **options)``: extra fields of the eval summary,
      called once after the rollouts. ``results`` holds ``summary``, ``per_task``,
      ``episodes``, ``tasks``, ``samples`` and ``split``; ``out_dir`` is the ``--out`` folder
      (or None). ``options`` always has ``report_name`` (the split, ``SPLIT-firstN`` for a
      partial one) and takes what the user passes as ``--report-options``; a hook documents its
      own options. Two returned keys are for the printed summary and are not stored:
      ``summary_text`` (appended to the one-line summary) and ``report_lines`` (printed after
      it).
    """

    eval_split: str
    on_turn_budget: str

    def evaluation_env_kwargs(self, samples: int) -> dict[str, Any]: ...

    def evaluation_task_fields(self, task_id: str, episodes: list[Any]) -> dict[str, Any]: ...

    def evaluation_report(
        self, results: dict[str, Any], out_dir: Any, **options: Any
    ) -> dict[str, Any]: ...


def observation_problem(observation: Any) -> str | None:
    """What is wrong with ``observation`` under the contract, or None: it must be a str that
    encodes as UTF-8 (a lone surrogate, e.g. from bytes decoded with ``surrogateescape``,
    does not, and no tokenizer takes it)."""
    if not isinstance(observation, str):
        return f"observation is a {type(observation).__name__}, not a str"
    try:
        observation.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = observation[exc.start]
        return (
            f"observation is not valid UTF-8 text (lone surrogate {bad!r} at character {exc.start})"
        )
    return None


def _not_a_number(reward: Any) -> str | None:
    # numbers.Real covers int, float, bool and numpy's integer and floating scalars; a str
    # such as "1.0" is not a reward even though float() would take it.
    if isinstance(reward, numbers.Real):
        return None
    return f"reward {reward!r} is a {type(reward).__name__}, not a real number"


def reward_problem(reward: Any, reward_range: tuple[float, float]) -> str | None:
    """What is wrong with a terminal ``reward`` under the contract, or None."""
    problem = _not_a_number(reward)
    if problem is not None:
        return problem
    value = float(reward)
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


def check_success_flag(info: dict[str, Any]) -> None:
    """:class:`EnvContractError` unless ``info["success"]``, when present, is a bool (Python's
    or numpy's): ``bool("False")`` is True, so a string flag would count as solved."""
    if "success" not in info:
        return
    flag = info["success"]
    if not isinstance(flag, bool | np.bool_):
        raise EnvContractError(f"info['success'] is a {type(flag).__name__} ({flag!r}), not a bool")


def check_reply(observation: Any, info: Any) -> None:
    """:class:`EnvContractError` unless ``observation`` is UTF-8 text (a str), ``info`` a dict
    and its ``success``, if any, a bool."""
    problem = observation_problem(observation)
    if problem is None and not isinstance(info, dict):
        problem = f"info is a {type(info).__name__}, not a dict"
    if problem is not None:
        raise EnvContractError(problem)
    check_success_flag(info)


def check_step_reward(
    reward: Any, terminal: bool, reward_range: Any = None, turn_rewards: bool = False
) -> None:
    """One step's ``reward`` under the contract: a real number; on the last step finite and
    within ``reward_range`` (:func:`check_terminal_reward`); before it, 0. Rewards are
    terminal: a reward paid earlier is an error, never dropped and never summed.

    ``turn_rewards`` (the run takes per-turn rewards): every step's reward need only be a
    finite real number; the caller checks the episode's return against ``reward_range``."""
    if terminal and not turn_rewards:
        check_terminal_reward(reward, reward_range)
        return
    problem = _not_a_number(reward)
    if problem is None and turn_rewards and not math.isfinite(float(reward)):
        problem = f"reward {float(reward)} is not finite"
    if problem is None and not turn_rewards and reward != 0:
        problem = (
            f"reward {float(reward):g} before the episode's last step; rewards are terminal "
            "(every step before the last returns 0) unless the run takes per-turn rewards "
            "(--turn-rewards)"
        )
    if problem is not None:
        raise EnvContractError(problem)


def check_terminal_reward(reward: Any, reward_range: Any = None, info: Any = None) -> None:
    """:class:`EnvContractError` unless ``reward`` is a finite real number within
    ``reward_range`` (None: :data:`DEFAULT_REWARD_RANGE`) and, when the last step's ``info`` is
    given, its ``info["success"]`` is present and a bool (Python's or numpy's).

    The one check of a terminal outcome: the rollout loop applies it to every episode's end,
    :func:`entrogym.envs.check_text_env` to the episodes it runs."""
    bounds = check_reward_range(DEFAULT_REWARD_RANGE if reward_range is None else reward_range)
    problem = reward_problem(reward, bounds)
    if problem is not None:
        raise EnvContractError(problem)
    if info is None:
        return
    if not isinstance(info, dict) or "success" not in info:
        raise EnvContractError(
            f"info['success'] must be a bool on the last step; got info={info!r}"
        )
    check_success_flag(info)
