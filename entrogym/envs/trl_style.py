"""Envs written for TRL's ``GRPOTrainer(environment_factory=Class)``, trained unchanged.

TRL's contract (``trl`` 1.16): the class is built with no arguments; ``reset(**row)`` starts a
rollout and returns None or a string, appended to the prompt's last user message; every public
method other than ``reset`` and ``get_reward`` (type hints and a Google-style docstring each) is
a tool; ``get_reward()`` (optional in TRL, required here: entrogym has no separate reward
functions) scores the rollout from the env's own state. A rollout ends when the model answers
without a tool call. Any of these methods may be ``async``.

:class:`TRLStyleEnv` wraps such a class as a :class:`~entrogym.envs.tool_env.ToolEnv`, one
instance per episode. Its tasks:

- with ``dataset`` (a list of rows, or a ``.json`` / ``.jsonl`` file of them): one task per row,
  ids ``train-0``, ``train-1``, ...; ``reset`` gets the row's columns as keyword arguments, as in
  TRL, and the row's ``prompt`` (a string, or a list of chat messages ending with the user's)
  is the prompt the reset text is appended to. ``test_dataset`` adds a ``test`` split the
  same way.
- without one, the env owns its data, as in TRL's dataset-free mode: ``num_tasks`` tasks per
  split (``train``, ``test``), each ``reset(prompt=[{"role": "user", "content": ""}])`` called
  with Python's ``random`` seeded from the task id (restored afterwards), so the K samples of a
  task start from the same state and a task id always means the same task.

``entrogym train --env my_module:MyEnv`` finds such a class (:func:`is_trl_style`) and
registers it (:mod:`entrogym.envs.resolve`); ``--env-kwargs`` sets the options below.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from entrogym.envs.base import Turn
from entrogym.envs.resolve import is_trl_style, trl_tools
from entrogym.envs.tool_env import ToolEnv, call_maybe_async
from entrogym.envs.tools import ToolDefinitionError

__all__ = ["TRLStyleEnv"]

DEFAULT_MAX_TURNS = 10
DEFAULT_NUM_TASKS = 100
EMPTY_PROMPT = [{"role": "user", "content": ""}]  # what TRL resets a dataset-free env with


def _load_rows(data: Any, option: str) -> list[dict[str, Any]]:
    """Rows from a list of dicts or a ``.json`` (a list) / ``.jsonl`` file."""
    if isinstance(data, str | Path):
        path = Path(data).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{option} {str(data)!r} is not a file")
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
    if not isinstance(data, list) or not data or not all(isinstance(r, dict) for r in data):
        raise ValueError(
            f"{option} must be a non-empty list of rows (dicts) or a .json / .jsonl file of them"
        )
    return [dict(r) for r in data]


def _prompt_text(prompt: Any, where: str) -> str:
    """The text of a row's ``prompt``: a string, or the content of the last of its messages,
    which must be the only one (entrogym's agent renders the system message)."""
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and len(prompt) == 1
        and isinstance(prompt[0], dict)
        and prompt[0].get("role") == "user"
        and isinstance(prompt[0].get("content"), str)
    ):
        return prompt[0]["content"]
    raise ValueError(
        f"{where}: prompt must be a string or one user message [{{'role': 'user', 'content': "
        "...}]; pass a system message with --system-prompt"
    )


class TRLStyleEnv(ToolEnv):
    """A TRL ``environment_factory`` class as a text env with tools (module docstring).

    Args:
        env_class: the class, or ``"module:Class"``.
        dataset: rows of the ``train`` split (list of dicts, or a .json / .jsonl file); None =
            the env owns its data (``num_tasks`` seeded tasks).
        test_dataset: rows of the ``test`` split (None: ``num_tasks`` seeded tasks without a
            dataset, no ``test`` split with one).
        num_tasks: tasks per split when the env owns its data.
        max_turns: actions per episode (TRL's ``max_tool_calling_iterations``); at the limit
            the episode is graded by ``get_reward`` as it stands.
        reward_range: the range of ``get_reward``'s values; a reward at its top is a success.
        split: the default split.
    """

    def __init__(
        self,
        env_class: str | type,
        *,
        dataset: str | list[dict[str, Any]] | None = None,
        test_dataset: str | list[dict[str, Any]] | None = None,
        num_tasks: int = DEFAULT_NUM_TASKS,
        max_turns: int = DEFAULT_MAX_TURNS,
        reward_range: tuple[float, float] | None = None,
        split: str | None = None,
        render_mode: str | None = None,
    ) -> None:
        cls = _load_class(env_class) if isinstance(env_class, str) else env_class
        if not is_trl_style(cls):
            raise TypeError(f"{cls!r} is not a TRL-style env (a class with reset and tools)")
        if not callable(getattr(cls, "get_reward", None)):
            raise ValueError(
                f"{cls.__name__} has no get_reward method; entrogym trains on the reward the "
                "env computes: add get_reward(self) -> float"
            )
        if not isinstance(num_tasks, int) or num_tasks < 1:
            raise ValueError(f"num_tasks must be a positive integer, got {num_tasks!r}")
        self.env_class = cls
        self.inner = cls()
        self._rows: dict[str, list[dict[str, Any]] | None] = {}
        if dataset is None:
            self._rows = {"train": None, "test": None}
        else:
            self._rows["train"] = _load_rows(dataset, "dataset")
            if test_dataset is not None:
                self._rows["test"] = _load_rows(test_dataset, "test_dataset")
        for name, rows in self._rows.items():
            for i, row in enumerate(rows or []):  # a bad prompt fails when the env is made
                _prompt_text(row.get("prompt"), f"{cls.__name__} task {name}-{i}")
        self.num_tasks = num_tasks
        super().__init__(split=split, max_turns=max_turns, render_mode=render_mode,
                         reward_range=reward_range)  # fmt: skip
        if split is not None:
            self.resolve_split(split)

    def tools(self) -> list[Callable[..., Any]]:
        tools = trl_tools(self.inner)
        for fn in tools:
            if getattr(fn, "__doc__", None) is None:
                raise ToolDefinitionError(
                    f"{self.env_class.__name__}.{fn.__name__} is public, so TRL and entrogym offer "
                    "it as a tool, but it has no docstring; document it (Google style) or make "
                    "it private (_name)"
                )
        return tools

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self._rows)

    def task_ids(self, split: str | None = None) -> list[str]:
        name = self.resolve_split(split)
        rows = self._rows[name]
        count = self.num_tasks if rows is None else len(rows)
        return [f"{name}-{i}" for i in range(count)]

    def has_task(self, task_id: str) -> bool:
        split, _, index = task_id.rpartition("-")
        return split in self._rows and index.isdigit() and int(index) < len(self.task_ids(split))

    def _start_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        split, _, index = task_id.rpartition("-")
        rows = self._rows[split]
        row = {"prompt": EMPTY_PROMPT} if rows is None else rows[int(index)]
        prompt = _prompt_text(row.get("prompt"), f"{self.env_class.__name__} task {task_id!r}")
        state = random.getstate()
        random.seed(zlib.crc32(task_id.encode()))
        try:
            text = call_maybe_async(self.inner.reset, **row)
        finally:
            random.setstate(state)
        if text is not None and not isinstance(text, str):
            raise TypeError(
                f"{self.env_class.__name__}.reset returned {type(text).__name__}; return a "
                "string (appended to the prompt) or None"
            )
        observation = prompt + (text or "")
        if not observation:
            raise ValueError(
                f"{self.env_class.__name__}.reset returned no text for task {task_id!r} and its "
                "row has no prompt: return the task's instruction from reset or add a prompt "
                "column to the dataset"
            )
        return observation, {}

    def _grade(self) -> Turn:
        reward = call_maybe_async(self.inner.get_reward)
        value = float(reward) if isinstance(reward, int | float) else reward
        success = isinstance(value, float) and value >= self.reward_range[1]
        return Turn(done=True, reward=value, success=success, reward_parts={"get_reward": value})


def _load_class(path: str) -> type:
    import importlib

    module, _, name = path.rpartition(":")
    if not module:
        raise ValueError(f"env_class must be 'module:Class', got {path!r}")
    obj = getattr(importlib.import_module(module), name, None)
    if obj is None:
        raise ValueError(f"module {module!r} has no {name!r}")
    return obj
