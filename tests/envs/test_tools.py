"""Tools as a seam, env side: schemas from type hints, the messages that carry calls, and
ToolEnv's handling of every kind of call (right, unknown, bad arguments, raising, unparseable)."""

from __future__ import annotations

import json

import pytest
from tool_envs import CONTACTS, PhoneEnv, demonstration

from entrogym.envs import check_text_env
from entrogym.envs.tool_env import ToolEnv
from entrogym.envs.tools import (
    AgentMessage,
    ToolCall,
    ToolDefinitionError,
    argument_problem,
    tool,
    tool_schema,
    tools_problem,
)


def buy(item: str, quantity: int = 1, gift: bool = False, tags: list[str] | None = None) -> str:
    """Buy an item from the shop.

    Args:
        item: What to buy.
        quantity: How many.
        gift: Whether to wrap it.
        tags: Labels for the order.
    """
    return f"bought {quantity} {item}"


def test_schema_from_type_hints_and_docstring():
    schema = tool_schema(buy)
    function = schema["function"]
    assert schema["type"] == "function" and function["name"] == "buy"
    assert function["description"] == "Buy an item from the shop."
    props = function["parameters"]["properties"]
    assert props["item"] == {"type": "string", "description": "What to buy."}
    assert props["quantity"]["type"] == "integer" and props["quantity"]["default"] == 1
    assert props["gift"]["type"] == "boolean" and props["gift"]["default"] is False
    assert props["tags"]["type"] == "array" and props["tags"]["items"] == {"type": "string"}
    assert function["parameters"]["required"] == ["item"]
    json.dumps(schema)  # plain JSON: it crosses process boundaries


def no_hint(name) -> str:
    """Find.

    Args:
        name: Who.
    """
    return name


def no_doc(name: str) -> str:
    return name


def no_args_entry(name: str, age: int) -> str:
    """Find someone.

    Args:
        name: Who.
    """
    return name


@pytest.mark.parametrize(
    ("fn", "words"),
    [(no_hint, "type hint"), (no_doc, "docstring"), (no_args_entry, "Args: entry")],
)
def test_bad_tool_definitions_are_one_line_naming_the_tool(fn, words):
    with pytest.raises(ToolDefinitionError) as caught:
        tool_schema(fn)
    message = str(caught.value)
    assert fn.__name__ in message and words in message and "\n" not in message
    assert isinstance(caught.value, ValueError)  # commands report it as bad input (exit 2)


def test_env_with_a_bad_tool_fails_when_made():
    class Bad(PhoneEnv):
        @tool
        def lookup(self, name):  # no type hint
            """Look up.

            Args:
                name: Who.
            """
            return name

    with pytest.raises(ToolDefinitionError, match="lookup"):
        Bad()


def test_agent_message_round_trips_through_its_action():
    message = AgentMessage("thinking", [ToolCall("buy", {"item": "tea", "quantity": 2})])
    again = AgentMessage.from_action(message.to_action())
    assert again == message
    assert (
        AgentMessage.from_action(AgentMessage(parse_error="bad").to_action()).parse_error == "bad"
    )
    # text that is not an agent message (a person, an env checker) is a message without calls
    assert AgentMessage.from_action("hello") == AgentMessage("hello")
    assert AgentMessage.from_action('{"content": 1}') == AgentMessage('{"content": 1}')


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"item": "tea"}, None),
        ({"item": "tea", "quantity": 3, "gift": True, "tags": ["a"]}, None),
        ({"item": "tea", "tags": None}, None),
        ({}, "missing argument(s) item"),
        ({"item": "tea", "colour": "red"}, "unexpected argument(s) colour"),
        ({"item": 3}, "argument item must be string"),
        ({"item": "tea", "quantity": "2"}, "argument quantity must be integer"),
        ({"item": "tea", "quantity": True}, "argument quantity must be integer"),
        ({"item": "tea", "tags": ["a", 1]}, "argument tags[1] must be string"),
    ],
)
def test_argument_checks(arguments, problem):
    found = argument_problem(tool_schema(buy), arguments)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def step(env: ToolEnv, *calls: ToolCall, content: str = "", error: str | None = None):
    return env.step(AgentMessage(content, list(calls), error).to_action())


def test_reset_info_carries_the_tool_schemas():
    env = PhoneEnv()
    observation, info = env.reset(options={"task_id": "bob"})
    assert observation == "Send 'hi' to Bob."
    names = [t["function"]["name"] for t in info["tools"]]
    assert names == ["find_contact", "send_message", "complete_task"]
    assert info["tools"] == json.loads(json.dumps(info["tools"]))


def test_right_calls_then_a_message_without_a_call_end_and_grade():
    env = PhoneEnv()
    env.reset(options={"task_id": "bob"})
    obs, reward, done, truncated, info = step(env, ToolCall("find_contact", {"name": "Bob"}))
    assert (obs, reward, done, info["tool_calls"], info["tool_errors"]) == (
        "555-0101",
        0,
        False,
        1,
        0,
    )
    call = ToolCall("send_message", {"phone": "555-0101", "text": "hi"})
    assert step(env, call)[0] == "sent"
    obs, reward, done, truncated, info = step(env, content="done")
    assert done and not truncated and reward == 1.0 and info["success"]
    assert info["end_reason"] == "done" and info["tool_calls"] == 0


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (ToolCall("fly", {}), "unknown tool 'fly'; available: find_contact, send_message"),
        (ToolCall("find_contact", {}), "missing argument(s) name"),
        (ToolCall("find_contact", {"name": "Bob", "x": 1}), "unexpected argument(s) x"),
        (ToolCall("send_message", {"phone": 5, "text": "x"}), "phone must be string"),
        (ToolCall("find_contact", {"name": "Zed"}), "find_contact raised KeyError: 'Zed'"),
    ],
)
def test_a_wrong_call_is_an_observation_and_a_counted_error(call, words):
    env = PhoneEnv()
    env.reset(options={"task_id": "bob"})
    obs, reward, done, truncated, info = step(env, call)
    assert words in obs and not done and reward == 0
    assert info["tool_calls"] == 1 and info["tool_errors"] == 1
    raised = "raised" in words
    assert ("tool_tracebacks" in info) == raised
    if raised:
        (trace,) = info["tool_tracebacks"]
        assert trace["tool"] == "find_contact" and "KeyError" in trace["traceback"]
        assert "Traceback" in trace["traceback"]
    # the episode goes on: the right call still works
    assert step(env, ToolCall("find_contact", {"name": "Bob"}))[0] == CONTACTS["Bob"]


def test_an_unparseable_message_is_an_observation_naming_the_format():
    env = PhoneEnv()
    env.reset(options={"task_id": "bob"})
    obs, _, done, _, info = step(env, error="cannot read the tool call x(; write tool(arg=1)")
    assert obs.startswith("cannot read") and not done
    assert (info["tool_calls"], info["tool_errors"]) == (0, 1)


def test_several_calls_run_in_order_and_their_results_are_joined():
    env = PhoneEnv()
    env.reset(options={"task_id": "ann"})
    calls = [ToolCall("find_contact", {"name": "Ann"}), ToolCall("fly", {}),
             ToolCall("send_message", {"phone": "555-0102", "text": "see you"})]  # fmt: skip
    obs, _, _, _, info = step(env, *calls)
    parts = obs.split("\n\n")
    assert parts[0] == "555-0102" and parts[1].startswith("unknown tool") and parts[2] == "sent"
    assert (info["tool_calls"], info["tool_errors"]) == (3, 1)
    assert env.sent == [("555-0102", "see you")]


def test_a_tool_may_end_the_episode():
    env = PhoneEnv()
    env.reset(options={"task_id": "ann"})
    obs, reward, done, _, info = step(env, ToolCall("complete_task", {}))
    assert done and obs == "ok" and reward == 0.0 and info["end_reason"] == "done"
    assert info["success"] is False and info["reward_parts"] == {"sent": 0.0}


def test_max_turns_grades_the_state_as_left():
    env = PhoneEnv(max_turns=2)
    env.reset(options={"task_id": "bob"})
    step(env, ToolCall("find_contact", {"name": "Bob"}))
    call = ToolCall("send_message", {"phone": "555-0101", "text": "hi"})
    obs, reward, done, truncated, info = step(env, call)
    assert truncated and not done and reward == 1.0 and info["end_reason"] == "max_turns"


def test_demonstration_is_checked_against_the_tools():
    env = PhoneEnv(demonstration=True)
    _, info = env.reset(options={"task_id": "bob"})
    assert info["demonstration"] == demonstration()
    tools = info["tools"]
    assert tools_problem(tools, info["demonstration"]) is None
    bad = [{"role": "assistant", "tool_calls": [{"name": "fly", "arguments": {}}]}]
    assert "fly" in tools_problem(tools, bad)
    assert "role" in tools_problem(tools, [{"role": "boss", "content": "x"}])
    assert "no tools" in tools_problem(None, bad)
    assert "list" in tools_problem({"a": 1})


def test_a_tool_env_passes_the_env_checker():
    check_text_env(PhoneEnv(), max_tasks=2)


def test_grading_must_be_provided():
    class NoGrade(ToolEnv):
        splits = ("train",)

        def task_ids(self, split=None):
            return ["t"]

        def _start_task(self, task_id):
            return "go", {}

    env = NoGrade()
    env.reset(options={"task_id": "t"})
    with pytest.raises(NotImplementedError):
        env.step("done")
