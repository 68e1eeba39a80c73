"""Tools an env offers the agent: JSON schemas from Python functions, and the messages that
carry tool calls across the text action space.

A tool is a Python callable with a type hint on every argument and a Google-style docstring
(a description and an ``Args:`` entry per argument), the convention of ``transformers``' chat
templates and TRL. :func:`tool_schema` turns one into the OpenAI-style schema that chat
templates render::

    {"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}

The agent parses each sampled turn into an :class:`AgentMessage` (its text and the
:class:`ToolCall`\\ s in it) and steps a tool env with :meth:`AgentMessage.to_action`, a JSON
string, so structured calls cross Gymnasium's text action space and the env-worker process
boundary unchanged; :meth:`AgentMessage.from_action` reads it back in the env.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AgentMessage",
    "ToolCall",
    "ToolDefinitionError",
    "argument_problem",
    "demonstration_problem",
    "is_tool",
    "tool",
    "tool_schema",
    "tools_problem",
]

_TOOL_MARK = "__entrogym_tool__"


class ToolDefinitionError(ValueError):
    """A tool that cannot be described to the model (no type hint on an argument, no docstring,
    no ``Args:`` entry for an argument); the message is one line naming the tool."""


def tool(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a method of a :class:`~entrogym.envs.tool_env.ToolEnv` subclass as a tool (the
    default :meth:`ToolEnv.tools` offers every method so marked)."""
    setattr(fn, _TOOL_MARK, True)
    return fn


def is_tool(obj: Any) -> bool:
    """Whether ``obj`` was marked with :func:`tool`."""
    return bool(getattr(obj, _TOOL_MARK, False))


def tool_name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__name__", type(fn).__name__))


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI-style JSON schema of ``fn``, from its type hints and Google-style docstring
    (``transformers.utils.get_json_schema``). Arguments with a JSON-serialisable default get it
    as ``"default"``. Raises :class:`ToolDefinitionError` (one line) for a tool that cannot be
    described: an argument without a type hint, no docstring, or no ``Args:`` entry for an
    argument."""
    from transformers.utils import get_json_schema

    name = tool_name(fn)
    if not callable(fn):
        raise ToolDefinitionError(f"tool {name!r} is not callable; pass a function or a method")
    try:
        schema = get_json_schema(fn)
    except Exception as exc:  # noqa: BLE001 - transformers raises plain Exception subclasses
        raise ToolDefinitionError(_definition_problem(name, exc)) from None
    if not schema["function"].get("description"):
        raise ToolDefinitionError(
            f"tool {name!r} has no description; start its docstring with one line saying what "
            "it does"
        )
    properties = schema["function"]["parameters"].get("properties", {})
    for arg, parameter in inspect.signature(fn).parameters.items():
        if arg in properties and parameter.default is not inspect.Parameter.empty:
            try:
                json.dumps(parameter.default)
            except (TypeError, ValueError):
                continue
            properties[arg]["default"] = parameter.default
    return schema


def _definition_problem(name: str, exc: Exception) -> str:
    """One line saying what ``name`` lacks, from ``get_json_schema``'s exception."""
    text = " ".join(str(exc).split())
    if "type hint" in text:
        return (
            f"tool {name!r}: {text}; give every argument a type hint, e.g. "
            "def find_contact(name: str) -> str"
        )
    if "no docstring" in text:
        return (
            f"tool {name!r} has no docstring; add one with a description line and an Args: "
            "entry per argument (Google style)"
        )
    if "no description for the argument" in text:
        return (
            f"tool {name!r}: {text}; add an Args: entry for it (Google style: 'name: what it is')"
        )
    return f"tool {name!r} cannot be described to the model ({text})"


# ----- calls and messages --------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool by name with keyword arguments (JSON-serialisable values)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments)}

    @classmethod
    def from_json(cls, data: Any) -> ToolCall:
        """A call from ``{"name": str, "arguments": dict}``; ValueError for anything else."""
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError(f"a tool call is {{'name': str, 'arguments': dict}}, got {data!r}")
        arguments = data.get("arguments", {})
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ValueError(f"the arguments of tool call {data['name']!r} are not a mapping")
        return cls(data["name"], dict(arguments))


@dataclass(frozen=True)
class AgentMessage:
    """What the agent parsed from one sampled turn: its text (``content``, tool calls taken
    out), the tool calls in it, and ``parse_error`` when the text tried to call a tool in a
    form the agent's tool format cannot read (the error names the expected form)."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_error: str | None = None

    def to_action(self) -> str:
        """The canonical JSON string an env with tools is stepped with."""
        data = {
            "content": self.content,
            "tool_calls": [c.to_json() for c in self.tool_calls],
            "parse_error": self.parse_error,
        }
        return json.dumps(data, ensure_ascii=False, sort_keys=True, allow_nan=False)

    @classmethod
    def from_action(cls, action: str) -> AgentMessage:
        """The message of :meth:`to_action`'s string; any other text (a person stepping the env
        by hand, an env checker) is a message with that content and no tool call."""
        try:
            data = json.loads(action)
        except (TypeError, ValueError):
            return cls(content=action)
        if not (isinstance(data, dict) and set(data) == {"content", "tool_calls", "parse_error"}):
            return cls(content=action)
        try:
            calls = [ToolCall.from_json(c) for c in data["tool_calls"]]
        except (TypeError, ValueError):
            return cls(content=action)
        error = data["parse_error"]
        return cls(str(data["content"]), calls, None if error is None else str(error))


# ----- argument checks -----------------------------------------------------------------------

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def _type_problem(value: Any, spec: dict[str, Any], where: str) -> str | None:
    """Why ``value`` does not fit the JSON schema ``spec`` (types, enums, array items), or None."""
    if value is None and spec.get("nullable"):
        return None
    if "enum" in spec and value not in spec["enum"]:
        return f"{where} must be one of {spec['enum']}, got {value!r}"
    kinds = spec.get("type")
    if kinds is None:
        return None
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    allowed = tuple(t for k in kinds for t in _JSON_TYPES.get(k, (object,)))
    is_bool = isinstance(value, bool)
    if not isinstance(value, allowed) or (is_bool and "boolean" not in kinds):
        return f"{where} must be {' or '.join(kinds)}, got {type(value).__name__} {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} must be a finite number, got {value!r}"
    items = spec.get("items")
    if isinstance(value, list | tuple) and isinstance(items, dict):
        for i, item in enumerate(value):
            problem = _type_problem(item, items, f"{where}[{i}]")
            if problem:
                return problem
    return None


def argument_problem(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """What is wrong with ``arguments`` for the tool of ``schema`` (a missing or unexpected
    argument, a value of the wrong type), or None when they fit."""
    function = schema["function"]
    name = function["name"]
    parameters = function.get("parameters", {})
    properties = parameters.get("properties", {})
    missing = [a for a in parameters.get("required", []) if a not in arguments]
    if missing:
        return f"{name}: missing argument(s) {', '.join(missing)}; it takes {_signature(schema)}"
    extra = [a for a in arguments if a not in properties]
    if extra:
        return f"{name}: unexpected argument(s) {', '.join(extra)}; it takes {_signature(schema)}"
    for arg, value in arguments.items():
        problem = _type_problem(value, properties[arg], f"{name}: argument {arg}")
        if problem:
            return problem
    return None


def _signature(schema: dict[str, Any]) -> str:
    parameters = schema["function"].get("parameters", {})
    names = list(parameters.get("properties", {}))
    return f"{schema['function']['name']}({', '.join(names)})"


# ----- what a reset info may carry -----------------------------------------------------------

DEMONSTRATION_ROLES = ("user", "assistant", "tool")


def demonstration_problem(messages: Any, tools: set[str] | None = None) -> str | None:
    """What is wrong with a reset info's ``"demonstration"`` (a worked example as chat
    messages: ``user``; ``assistant`` with optional ``tool_calls`` ``[{"name", "arguments"}]``
    of the env's ``tools``; ``tool``), or None."""
    if not isinstance(messages, list):
        return "info['demonstration'] must be a list of chat messages"
    for i, message in enumerate(messages):
        where = f"demonstration message {i}"
        if not isinstance(message, dict) or message.get("role") not in DEMONSTRATION_ROLES:
            return f"{where} must be a dict with a role in {list(DEMONSTRATION_ROLES)}"
        if not isinstance(message.get("content") or "", str):
            return f"{where}: content must be a str"
        calls = message.get("tool_calls") or []
        if calls and message["role"] != "assistant":
            return f"{where}: only assistant messages carry tool_calls"
        for call in calls if isinstance(calls, list) else [calls]:
            try:
                parsed = ToolCall.from_json(call)
            except ValueError as exc:
                return f"{where}: {exc}"
            if tools is not None and parsed.name not in tools:
                return f"{where} calls {parsed.name!r}, which is not a tool of the env"
    return None


def tools_problem(tools: Any, demonstration: Any = None) -> str | None:
    """What is wrong with a reset info's ``"tools"`` (a list of JSON schemas, as
    :func:`tool_schema` makes them) and ``"demonstration"``, or None. Without tools an env has
    no demonstration."""
    if tools is None:
        return None if demonstration is None else "info has a demonstration but no tools"
    if not isinstance(tools, list):
        return f"info['tools'] must be a list of tool schemas, got {type(tools).__name__}"
    for schema in tools:
        function = schema.get("function") if isinstance(schema, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return "each of info['tools'] must be a schema {'type': 'function', 'function': {'name': ...}}"
    if demonstration is None:
        return None
    return demonstration_problem(demonstration, {t["function"]["name"] for t in tools})
