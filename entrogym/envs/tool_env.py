"""``ToolEnv``: the base class of text envs whose actions call tools.

A subclass declares its tools (methods marked with :func:`~entrogym.envs.tools.tool`, or
whatever :meth:`ToolEnv.tools` returns), says how an episode is graded (:meth:`ToolEnv._grade`)
and, like every :class:`~entrogym.envs.base.TextEnv`, lists its tasks and starts them. The base
class does the rest:

- the tools' schemas are built when the env is made (a tool without type hints or a docstring
  is a :class:`~entrogym.envs.tools.ToolDefinitionError` before any model loads), and every
  ``reset`` info carries them as ``info["tools"]``, for the agent to render;
- each action is an :class:`~entrogym.envs.tools.AgentMessage` (as JSON); every tool call in it
  runs in order and the results, joined, are the observation, which the agent shows the model
  as a ``tool`` message;
- nothing a call does crashes the episode: an unknown tool, bad arguments, a tool that raises
  and a message the agent could not parse each become an observation that says what went
  wrong, and are counted in the step's ``info["tool_errors"]`` (a raising tool's traceback is
  kept in ``info["tool_tracebacks"]`` for the run folder);
- a message without a tool call ends the episode (:meth:`ToolEnv._on_message_without_call`),
  as does a tool that calls :meth:`ToolEnv.request_end`; then, and when ``max_turns`` runs out,
  :meth:`ToolEnv._grade` scores the state as the agent left it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import traceback
from collections.abc import Callable
from typing import Any

from entrogym.envs.base import TextEnv, Turn
from entrogym.envs.tools import (
    AgentMessage,
    ToolCall,
    ToolDefinitionError,
    argument_problem,
    demonstration_problem,
    is_tool,
    tool_schema,
)

__all__ = ["ToolEnv", "call_maybe_async", "format_result"]


def call_maybe_async(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, run to completion when ``fn`` is a coroutine function (TRL
    allows async tools and ``get_reward``)."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


def format_result(result: Any) -> str:
    """A tool's return value as the text the model sees: mappings and lists as JSON, anything
    else as ``str``."""
    if isinstance(result, dict | list | tuple):
        try:
            return json.dumps(result, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


class ToolEnv(TextEnv):
    """A text env whose actions call tools (module docstring).

    Subclasses implement :meth:`task_ids` / :attr:`splits`, :meth:`_start_task` (the task's
    first observation; its info may carry a ``"demonstration"``, a worked example as chat
    messages) and :meth:`_grade`; the tools are the methods marked ``@tool`` unless
    :meth:`tools` is overridden. Optional: :meth:`_on_message_without_call` (default: the
    episode ends and is graded), :meth:`_on_truncate` (default: :meth:`_grade`).

    Step info: ``tool_calls`` (calls in this action), ``tool_errors`` (unknown tools, bad
    arguments, tools that raised, an unparseable message), ``tool_tracebacks`` (when a tool
    raised: a list of ``{"tool", "error", "traceback"}``) and, on the last step, ``end_reason``
    (``"done"`` or ``"max_turns"``).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._end_requested = False
        self._tool_fns: dict[str, Callable[..., Any]] = {}
        self._schemas: list[dict[str, Any]] = []
        for fn in self.tools():
            schema = tool_schema(fn)
            name = schema["function"]["name"]
            if name in self._tool_fns:
                raise ToolDefinitionError(
                    f"{type(self).__name__} offers two tools named {name!r}; rename one"
                )
            self._tool_fns[name] = fn
            self._schemas.append(schema)

    # ----- what subclasses provide -------------------------------------------------------

    def tools(self) -> list[Callable[..., Any]]:
        """The tools of this env: by default its methods marked with ``@tool``, in the order
        the class defines them."""
        found: list[Callable[..., Any]] = []
        seen: set[str] = set()
        for klass in type(self).__mro__:
            for name, member in vars(klass).items():
                if name not in seen and is_tool(member):
                    seen.add(name)
                    found.append(getattr(self, name))
        return found

    def _grade(self) -> Turn:
        """The terminal outcome of the episode: ``reward``, ``success`` and ``reward_parts``
        from the state the agent left (``done`` is implied)."""
        raise NotImplementedError

    def _on_message_without_call(self, content: str) -> Turn:
        """The env's answer to a message that calls no tool: by default the episode ends and is
        graded (the agent says it is done)."""
        return self._grade()

    def _on_truncate(self) -> Turn:
        return self._grade()

    def request_end(self) -> None:
        """Called by a tool (e.g. ``complete_task``): the episode ends after this action's
        calls, graded by :meth:`_grade`."""
        self._end_requested = True

    # ----- the tool loop ---------------------------------------------------------------------

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The JSON schemas of the tools (what ``reset`` info carries as ``"tools"``)."""
        return json.loads(json.dumps(self._schemas))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        observation, info = super().reset(seed=seed, options=options)
        self._end_requested = False
        demonstration = info.get("demonstration")
        if demonstration is not None:
            problem = demonstration_problem(demonstration, set(self._tool_fns))
            if problem is not None:
                raise ValueError(f"{type(self).__name__}, task {self.task_id!r}: {problem}")
        return observation, {**info, "tools": self.tool_schemas}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = super().step(action)
        if terminated or truncated:
            info["end_reason"] = "done" if terminated else "max_turns"
        return observation, reward, terminated, truncated, info

    def _respond(self, action: str) -> Turn:
        message = AgentMessage.from_action(action)
        if message.parse_error is not None:
            return Turn(message.parse_error, info={"tool_calls": 0, "tool_errors": 1})
        if not message.tool_calls:
            turn = self._on_message_without_call(message.content)
            turn.info = {"tool_calls": 0, "tool_errors": 0, **turn.info}
            return turn
        results, errors, tracebacks = [], 0, []
        for call in message.tool_calls:
            text, failed, trace = self._run(call)
            results.append(text)
            errors += failed
            if trace is not None:
                tracebacks.append(trace)
        info: dict[str, Any] = {"tool_calls": len(message.tool_calls), "tool_errors": errors}
        if tracebacks:
            info["tool_tracebacks"] = tracebacks
        observation = "\n\n".join(results)
        if self._end_requested:
            end = self._grade()
            return Turn(observation, True, end.reward, end.success, end.reward_parts,
                        {**end.info, **info})  # fmt: skip
        return Turn(observation, info=info)

    def _run(self, call: ToolCall) -> tuple[str, bool, dict[str, str] | None]:
        """One call: (the text the model sees, whether it failed, the traceback if it raised)."""
        fn = self._tool_fns.get(call.name)
        if fn is None:
            available = ", ".join(self._tool_fns) or "none"
            return f"unknown tool {call.name!r}; available: {available}", True, None
        schema = self._schemas[list(self._tool_fns).index(call.name)]
        problem = argument_problem(schema, call.arguments)
        if problem is not None:
            return problem, True, None
        try:
            result = call_maybe_async(fn, **call.arguments)
        except Exception as exc:  # noqa: BLE001 - a tool's error is an observation, not a crash
            error = f"{call.name} raised {type(exc).__name__}: {exc}"
            trace = {"tool": call.name, "error": error, "traceback": traceback.format_exc()}
            return error, True, trace
        return format_result(result), False, None
