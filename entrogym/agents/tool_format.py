"""Tool-calling formats: how the tools are shown to the model and how its calls are read.

Three formats, by name (``--tool-format``):

- ``template``: the tokenizer's chat template renders the tools itself (its Jinja source uses
  ``tools``: Qwen, Llama 3, Hermes models); calls are read from Hermes / Qwen blocks
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
- ``json``: the same ``<tool_call>`` blocks, for templates without tools: entrogym writes the
  tools' JSON schemas and the calling convention into the system message.
- ``call``: one line per call, Python style, ``tool_name(arg="value", n=3)``; the system message
  lists the tools as signatures with their descriptions. Arguments are literals (strings,
  numbers, booleans, None, lists, dicts), read with ``ast.literal_eval``: nothing the model
  writes is ever evaluated.

Every format has ``system_block(tools)`` (the text added to the system message; None for
``template``), ``parse(text, tools)`` (one sampled turn as an
:class:`~entrogym.envs.tools.AgentMessage`) and ``render_call(call)`` (a call as the text
``parse`` reads back: demonstrations are rendered with it).

The default for a template without tools support is :data:`DEFAULT_TOOL_FORMAT`, chosen by
measuring SmolLM2-135M-Instruct (docs/envs.md): its base model writes a well-formed one-line
call far more often than a JSON block.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from entrogym.envs.tools import AgentMessage, ToolCall

__all__ = [
    "DEFAULT_TOOL_FORMAT",
    "TOOL_FORMATS",
    "ToolFormat",
    "get_tool_format",
    "resolve_tool_format",
    "template_supports_tools",
]

# The format for chat templates that do not render tools (SmolLM2's): one place to change it.
DEFAULT_TOOL_FORMAT = "call"

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_CALL_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*$")
_CALL_START = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_]*\(")

JSON_CALL_HELP = (
    'write each call as <tool_call>{"name": "TOOL", "arguments": {"ARG": VALUE}}</tool_call>'
)
CALL_HELP = 'write each call on its own line as tool_name(arg="value", n=3)'

_PY_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
             "array": "list", "object": "dict", "null": "None"}  # fmt: skip


@dataclass(frozen=True)
class ToolFormat:
    """One tool-calling format (module docstring); :data:`TOOL_FORMATS` holds them by name."""

    name: str

    @property
    def uses_template_tools(self) -> bool:
        """Whether the chat template renders the tools (``apply_chat_template(tools=...)``)."""
        return self.name == "template"

    def system_block(self, tools: Sequence[dict[str, Any]]) -> str | None:
        """The text this format adds to the system message for ``tools`` (None: none)."""
        if self.name == "template":
            return None
        if self.name == "json":
            return _json_block(tools)
        return _call_block(tools)

    def parse(self, text: str, tools: Sequence[dict[str, Any]] | None = None) -> AgentMessage:
        """The message in one sampled turn. ``tools`` (their schemas) let the ``call`` format
        read positional arguments in the order of the tool's parameters."""
        if self.name == "call":
            return _parse_call_lines(text, tools or ())
        return _parse_json_blocks(text)

    def render_call(self, call: ToolCall) -> str:
        """``call`` as this format writes it (what :meth:`parse` reads back as ``call``)."""
        if self.name == "call":
            args = ", ".join(f"{k}={_py_literal(v)}" for k, v in call.arguments.items())
            return f"{call.name}({args})"
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"<tool_call>\n{body}\n</tool_call>"


TOOL_FORMATS: dict[str, ToolFormat] = {n: ToolFormat(n) for n in ("template", "json", "call")}


def get_tool_format(name: str) -> ToolFormat:
    if name not in TOOL_FORMATS:
        raise ValueError(f"tool_format must be one of {list(TOOL_FORMATS)}, got {name!r}")
    return TOOL_FORMATS[name]


def template_supports_tools(template: Any) -> bool:
    """Whether a chat template's Jinja source uses ``tools`` (a dict of named templates: any)."""
    sources = template.values() if isinstance(template, dict) else [template]
    return any(isinstance(s, str) and re.search(r"\btools\b", s) for s in sources)


def resolve_tool_format(name: str | None, template: Any) -> ToolFormat:
    """``name``, or by default ``template`` where the chat template renders tools, else
    :data:`DEFAULT_TOOL_FORMAT`. ``template`` asked of a template without tools is a
    ValueError."""
    supports = template_supports_tools(template)
    if name is None:
        return TOOL_FORMATS["template" if supports else DEFAULT_TOOL_FORMAT]
    fmt = get_tool_format(name)
    if fmt.uses_template_tools and not supports:
        raise ValueError(
            "tool_format 'template' needs a chat template that renders tools (its Jinja source "
            "uses 'tools'); this one does not: pass --tool-format json or call"
        )
    return fmt


# ----- rendering -----------------------------------------------------------------------------


def _json_block(tools: Sequence[dict[str, Any]]) -> str:
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "You can call the following tools. Their signatures are JSON schemas inside "
        f"<tools></tools>:\n<tools>\n{lines}\n</tools>\n"
        "To call a tool, write a JSON object with its name and arguments inside "
        '<tool_call></tool_call> tags:\n<tool_call>\n{"name": "TOOL", "arguments": '
        '{"ARG": VALUE}}\n</tool_call>\nReply without a tool call when the task is finished.'
    )


def _call_block(tools: Sequence[dict[str, Any]]) -> str:
    lines = "\n".join(f"{_signature(t)} - {_summary(t)}" for t in tools)
    return (
        "You are an assistant that uses tools. Call a tool by writing one line: "
        'tool_name(arg="value"). Reply done when the task is finished.\n'
        f"Tools:\n{lines}"
    )


def _summary(schema: dict[str, Any]) -> str:
    """The first paragraph of a tool's description, on one line."""
    text = schema["function"].get("description", "").strip().split("\n\n")[0]
    return " ".join(text.split())


def _type_name(spec: dict[str, Any]) -> str:
    kinds = spec.get("type", "any")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    name = " | ".join(_PY_TYPES.get(k, k) for k in kinds)
    if spec.get("type") == "array" and isinstance(spec.get("items"), dict):
        name = f"list[{_type_name(spec['items'])}]"
    if spec.get("nullable"):
        name += " | None"
    return name


def _signature(schema: dict[str, Any]) -> str:
    """``name(a: str, n: int = 3)`` from a tool's JSON schema."""
    parameters = schema["function"].get("parameters", {})
    required = set(parameters.get("required", []))
    parts = []
    for arg, spec in parameters.get("properties", {}).items():
        part = f"{arg}: {_type_name(spec)}"
        if "enum" in spec:
            part += f" (one of {', '.join(_py_literal(v) for v in spec['enum'])})"
        if arg not in required:
            part += f" = {_py_literal(spec.get('default'))}"
        parts.append(part)
    return f"{schema['function']['name']}({', '.join(parts)})"


def _py_literal(value: Any) -> str:
    """``value`` as a Python literal that ``ast.literal_eval`` reads back (strings in double
    quotes, as JSON writes them)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"cannot write the non-finite number {value!r} as an argument")
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_py_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"{_py_literal(k)}: {_py_literal(v)}" for k, v in value.items()) + "}"
        )
    raise ValueError(f"cannot write {type(value).__name__} {value!r} as an argument")


# ----- parsing -------------------------------------------------------------------------------


def _parse_json_blocks(text: str) -> AgentMessage:
    """``<tool_call>{json}</tool_call>`` blocks (an unclosed last one is read to the end)."""
    calls, errors = [], []
    for match in _TOOL_CALL.finditer(text):
        body = match.group(1).strip()
        try:
            data = json.loads(body)
            if isinstance(data, dict) and "arguments" not in data and "parameters" in data:
                data = {"name": data.get("name"), "arguments": data["parameters"]}  # Llama 3's
            if isinstance(data, dict) and isinstance(data.get("arguments"), str):
                data = {**data, "arguments": json.loads(data["arguments"])}  # some models do
            calls.append(ToolCall.from_json(data))
        except (TypeError, ValueError) as exc:
            errors.append(f"cannot read the tool call {_short(body)} ({_short(str(exc), 80)})")
    content = _TOOL_CALL.sub("", text).strip()
    if errors:
        return AgentMessage(content, calls, f"{errors[0]}; {JSON_CALL_HELP}")
    return AgentMessage(content, calls)


def _parse_call_lines(text: str, tools: Sequence[dict[str, Any]]) -> AgentMessage:
    """One call per line ``name(arg=literal, ...)``; other lines are the message's text."""
    order = {
        t["function"]["name"]: list(t["function"].get("parameters", {}).get("properties", {}))
        for t in tools
    }
    calls, rest, errors = [], [], []
    for line in text.splitlines():
        # the model may quote a call as code or end it like a sentence
        bare = line.strip().rstrip(".;").strip("`").rstrip(".;").strip()
        if not _CALL_START.match(bare):
            rest.append(line)
            continue
        try:
            calls.append(_read_call(bare, order))
        except ValueError as exc:
            errors.append(f"cannot read the tool call {_short(bare)} ({exc})")
    content = "\n".join(rest).strip()
    if errors:
        return AgentMessage(content, calls, f"{errors[0]}; {CALL_HELP}")
    return AgentMessage(content, calls)


def _read_call(line: str, order: dict[str, list[str]]) -> ToolCall:
    match = _CALL_LINE.match(line)
    if match is None:
        raise ValueError("a call is one line that ends with ')'")
    name = match.group(1)
    try:
        node = ast.parse(f"f({match.group(2)})", mode="eval").body
    except SyntaxError:
        raise ValueError("its arguments are not valid Python") from None
    if not isinstance(node, ast.Call):
        # e.g. `f(a=1) + g(b=2)` or `f(a) or g(b)`: one expression, not one call
        raise ValueError("write one call per line: tool_name(arg=value)")
    arguments: dict[str, Any] = {}
    if node.args:
        params = order.get(name)
        if params is None or len(node.args) > len(params):
            raise ValueError("name the arguments: tool_name(arg=value)")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise ValueError("arguments must be literals")
        for param, arg in zip(params, node.args, strict=False):
            arguments[param] = _literal(arg)
    for keyword in node.keywords:
        if keyword.arg is None:
            raise ValueError("arguments must be literals")
        if keyword.arg in arguments:
            raise ValueError(f"argument {keyword.arg} given twice")
        arguments[keyword.arg] = _literal(keyword.value)
    return ToolCall(name, arguments)


def _literal(node: ast.expr) -> Any:
    """A JSON value written as a Python literal (no sets, bytes or complex numbers)."""
    problem = f"argument {_short(ast.unparse(node))} is not a literal (quote strings)"
    try:
        value = ast.literal_eval(node)
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(problem) from None
    if isinstance(value, tuple):
        return list(value)
    return value


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
