"""``TextEnv``: the Gymnasium base class of every entrogym text task, and registry helpers.

An episode is a conversation: ``reset`` returns the task's first observation (the prompt),
each ``step(action)`` takes the policy's text and returns the env's reply. Rewards are
terminal: every step before the last returns 0, the last one returns the episode's reward (within
the env's ``reward_range``), and its ``info`` carries ``success`` and ``reward_parts``.
Single-turn tasks end after one step. The contract is stated in :mod:`entrogym.envs.contract`
and checked by :func:`entrogym.envs.check_text_env`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from entrogym.envs.contract import (
    DEFAULT_REWARD_RANGE,
    EnvContractError,
    check_reward_range,
    observation_problem,
    reward_problem,
)
from entrogym.envs.spaces import UnicodeText

DEFAULT_MAX_CHARS = 65536


@dataclass
class Turn:
    """What a subclass's :meth:`TextEnv._respond` returns for one action.

    ``reward``, ``success`` and ``reward_parts`` are read only when ``done`` is true (rewards
    are terminal); ``info`` is merged into the step's info either way. ``turn_reward`` is
    paid for this action on any step (added to ``reward`` on the last): a per-turn reward,
    which only a run with per-turn rewards (``--turn-rewards``) takes; leave it 0 otherwise.
    """

    observation: str = ""
    done: bool = False
    reward: float = 0.0
    success: bool = False
    reward_parts: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    turn_reward: float = 0.0


class TextEnv(gym.Env[str, str]):
    """Base class for text tasks with terminal rewards.

    Subclasses implement :meth:`task_ids`, :meth:`_start_task` (the first observation of a
    task) and :meth:`_respond` (the env's answer to one action). Optionally :meth:`_on_truncate`
    (the terminal reward when ``max_turns`` runs out) and :meth:`has_task`.

    ``max_turns`` (class attribute or constructor argument, which wins; default 1): actions
    per episode before it is truncated (:meth:`_on_truncate`).

    ``reward_range`` (class attribute or constructor argument; default ``(0.0, 1.0)``, the
    range of verifiable rewards) bounds the terminal reward: a reward outside it, or one that
    is not finite, is an :class:`~entrogym.envs.contract.EnvContractError` naming the task.

    ``reset(seed=None, options={"task_id": ..., "split": ...})``: with a ``task_id`` that task
    starts; without one a task of the split (``options["split"]`` or the env's ``split``) is
    drawn with ``self.np_random``, so the same seed gives the same task.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    reset_option_keys: frozenset[str] = frozenset({"task_id", "split"})
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE
    max_turns: int = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # ``_begin`` is the hook's former name: a subclass that still defines it keeps working.
        if "_begin" in cls.__dict__ and "_start_task" not in cls.__dict__:
            warnings.warn(
                f"{cls.__name__}._begin is deprecated: rename it to _start_task",
                DeprecationWarning,
                stacklevel=2,
            )
            cls._start_task = cls.__dict__["_begin"]  # type: ignore[method-assign]

    def __init__(
        self,
        *,
        split: str | None = None,
        max_turns: int | None = None,
        max_observation_chars: int = DEFAULT_MAX_CHARS,
        max_action_chars: int = DEFAULT_MAX_CHARS,
        render_mode: str | None = None,
        reward_range: tuple[float, float] | None = None,
    ) -> None:
        if max_turns is None:  # the class's own declaration (``max_turns = 3``), else 1
            max_turns = type(self).max_turns
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be a positive integer, got {max_turns!r}")
        for name, value in (
            ("max_observation_chars", max_observation_chars),
            ("max_action_chars", max_action_chars),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be None or one of {self.metadata['render_modes']}, "
                f"got {render_mode!r}"
            )
        if reward_range is not None:
            self.reward_range = check_reward_range(reward_range)
        self.split = split
        self.max_turns = max_turns
        self.render_mode = render_mode
        self.observation_space = UnicodeText(max_observation_chars)
        # An action is what the policy generated: at least one character.
        self.action_space = UnicodeText(max_action_chars, min_length=1)
        self._task_id: str | None = None
        self._turn = 0
        self._done = False
        self._action_truncated = False
        self._transcript: list[tuple[str, str]] = []

    # ----- what subclasses provide -------------------------------------------------------

    @property
    def splits(self) -> tuple[str, ...]:
        """Names of the splits :meth:`task_ids` accepts."""
        raise NotImplementedError

    def task_ids(self, split: str | None = None) -> list[str]:
        """Ids of the tasks of ``split`` (the env's default split when None), in a fixed order.

        Raises ValueError for an unknown split or one with no tasks.
        """
        raise NotImplementedError

    def has_task(self, task_id: str) -> bool:
        return any(task_id in self.task_ids(s) for s in self.splits)

    def _start_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        """First observation of ``task_id`` (its prompt) and extra reset info. Must not change
        ``self``'s episode state: the base class commits it only once this returns."""
        raise NotImplementedError

    def _respond(self, action: str) -> Turn:
        """The env's answer to a valid action in the current episode."""
        raise NotImplementedError

    def _on_truncate(self) -> Turn:
        """Terminal outcome when ``max_turns`` actions were taken without the task ending."""
        return Turn(done=True, reward=0.0, success=False, reward_parts={})

    # ----- the Gymnasium API ---------------------------------------------------------------

    @property
    def task_id(self) -> str | None:
        """The task of the current episode (None before the first reset)."""
        return self._task_id

    @property
    def turn(self) -> int:
        """Actions taken so far in the current episode."""
        return self._turn

    def resolve_split(self, split: str | None) -> str:
        """``split`` or the env's default, checked against :attr:`splits`."""
        name = self.split if split is None else split
        if name is None:
            name = self.splits[0]
        if name not in self.splits:
            raise ValueError(
                f"unknown split {name!r} for {type(self).__name__}; choose one of {list(self.splits)}"
            )
        return name

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        options = dict(options or {})
        unknown = set(options) - set(self.reset_option_keys)
        if unknown:
            raise ValueError(
                f"unknown reset option(s) {sorted(unknown)}; "
                f"{type(self).__name__} accepts {sorted(self.reset_option_keys)}"
            )
        task_id = options.get("task_id")
        if task_id is not None:
            if not isinstance(task_id, str):
                raise TypeError(f"options['task_id'] must be a str, got {type(task_id).__name__}")
            if not self.has_task(task_id):
                raise ValueError(
                    f"unknown task_id {task_id!r} for {type(self).__name__}; "
                    "list the valid ones with task_ids(split)"
                )
            super().reset(seed=seed)
        else:
            candidates = self.task_ids(options.get("split"))  # raises before any state changes
            super().reset(seed=seed)
            task_id = candidates[int(self.np_random.integers(len(candidates)))]
        observation, extra = self._start_task(task_id)
        self._check_observation(observation, task_id)
        self._task_id, self._turn, self._done = task_id, 0, False
        self._action_truncated = False
        self._transcript = [("env", observation)]
        return observation, {**extra, "task_id": task_id, "turn": 0}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._task_id is None:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset()")
        if self._done:
            raise RuntimeError(
                f"the episode of task {self._task_id!r} has ended; call reset() to start another"
            )
        self._check_action(action)
        turn = self._respond(action)
        self._check_observation(turn.observation, self._task_id)
        turns = self._turn + 1
        terminated = bool(turn.done)
        truncated = not terminated and turns >= self.max_turns
        end = turn
        if truncated:
            end = self._on_truncate()
            end.info = {**turn.info, **end.info, "turn_limit_reached": True}
        info: dict[str, Any] = {**end.info, "task_id": self._task_id, "turn": turns}
        reward = self._checked_turn_reward(turn.turn_reward)
        if terminated or truncated:
            reward += self._checked_reward(end.reward)
            info["success"] = bool(end.success)
            info["reward_parts"] = dict(end.reward_parts)
        if self._action_truncated:
            info["action_truncated"] = True
        # Commit only now: an exception above leaves the episode as it was.
        self._turn, self._done, self._action_truncated = turns, terminated or truncated, False
        self._transcript += [("agent", action), ("env", turn.observation)]
        return turn.observation, reward, terminated, truncated, info

    def end_episode(self) -> tuple[float, dict[str, Any]]:
        """End the current episode before the env would (the agent's context window is full):
        returns the terminal reward and info of :meth:`_on_truncate` -- AppWorld evaluates the
        world as the agent left it, other envs score a failure."""
        if self._task_id is None or self._done:
            raise RuntimeError("end_episode() needs an episode in progress; call reset() first")
        end = self._on_truncate()
        reward = self._checked_reward(end.reward)
        self._done = True
        info = {
            **end.info,
            "task_id": self._task_id,
            "turn": self._turn,
            "success": bool(end.success),
            "reward_parts": dict(end.reward_parts),
        }
        return reward, info

    def flag_action_truncated(self) -> None:
        """Tell the env that the next action was cut at the agent's token budget.

        The env cannot count tokens (it has no tokenizer), so the agent, which enforces the
        budget, calls this before ``step``; that step's info then has ``action_truncated=True``.
        """
        self._action_truncated = True

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n\n".join(f"[{who}] {text}" for who, text in self._transcript)

    # ----- validation ------------------------------------------------------------------

    def _check_action(self, action: Any) -> None:
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        if not action:
            raise ValueError(
                "action is an empty string; pass the policy's text (at least one character)"
            )
        if len(action) > self.action_space.max_length:
            raise ValueError(
                f"action has {len(action)} characters, more than the bound of "
                f"{self.action_space.max_length}; raise max_action_chars or cut the action"
            )

    def _checked_reward(self, reward: Any) -> float:
        problem = reward_problem(reward, self.reward_range)
        if problem is not None:
            raise EnvContractError(f"{type(self).__name__}, task {self._task_id!r}: {problem}")
        return float(reward)

    def _checked_turn_reward(self, reward: Any) -> float:
        """A per-turn reward (``Turn.turn_reward``): any finite real number."""
        problem = reward_problem(reward, (-math.inf, math.inf))  # a finite real number
        if problem is not None:
            raise EnvContractError(f"{type(self).__name__}, task {self._task_id!r}: {problem}")
        return float(reward)

    def _check_observation(self, observation: str, task_id: str) -> None:
        problem = observation_problem(observation)
        if problem is not None:
            raise EnvContractError(f"{type(self).__name__}, task {task_id!r}: {problem}")
        if not self.observation_space.contains(observation):
            raise ValueError(
                f"observation of task {task_id!r} ({len(observation)} characters) does not fit "
                f"the observation space {self.observation_space}; raise max_observation_chars"
            )


# ----- registry helpers -----------------------------------------------------------------------


def is_text_env(env: gym.Env) -> bool:
    """Whether ``env`` (wrapped or not) is usable by entrogym commands: text observation and
    action spaces and a ``task_ids(split)`` method on the unwrapped env."""
    inner = env.unwrapped
    return (
        isinstance(inner.observation_space, gym.spaces.Text)
        and isinstance(inner.action_space, gym.spaces.Text)
        and callable(getattr(inner, "task_ids", None))
    )


def make_text_env(env_id: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make(env_id, **kwargs)``, checked to be a text env (see :func:`is_text_env`).

    Works for the built-in ids (after ``import entrogym``) and for any env a user registered
    with ``gymnasium.register``, subclass of :class:`TextEnv` or not. As in ``gymnasium.make``,
    ``"my_package.envs:MyEnv-v0"`` imports ``my_package.envs`` (where the user registers the
    env) first, which is how a command line names a user's env; ``"my_package.envs:MyEnv"``
    may also name an env class, a text env's or one written for TRL's ``environment_factory``
    (:func:`entrogym.envs.resolve.resolve_env_id`).
    """
    from entrogym.envs.resolve import resolve_env_id

    try:
        env = gym.make(resolve_env_id(env_id), **kwargs)
    except (gym.error.Error, ModuleNotFoundError) as e:
        raise ValueError(f"cannot make env {env_id!r}: {e}") from e
    if not is_text_env(env):
        inner = env.unwrapped
        env.close()
        raise TypeError(
            f"{env_id!r} ({type(inner).__name__}) is not a text env: entrogym needs "
            "gymnasium.spaces.Text observation and action spaces and a task_ids(split) method"
        )
    return env


def env_attr(env: Any, name: str, default: Any = None) -> Any:
    """``env.get_wrapper_attr(name)`` (Gymnasium wrappers do not forward entrogym's methods,
    and a wrapper may override one), or ``default`` when the env has no such attribute."""
    try:
        return env.get_wrapper_attr(name)
    except AttributeError:
        return default


def task_ids_of(env: gym.Env, split: str | None = None) -> list[str]:
    """``env.get_wrapper_attr("task_ids")(split)``: Gymnasium wrappers do not forward custom
    methods, and a wrapper may override one."""
    return list(env.get_wrapper_attr("task_ids")(split))
