"""Tool formats: what the model is shown and how its calls are read, for each format, and the
agent's rendering of tools, demonstrations and tool answers on SmolLM2's real tokenizer."""

from __future__ import annotations

import copy

import pytest
from tool_envs import PhoneEnv, demonstration
from transformers import AutoTokenizer

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines.base import Completion
from entrogym.agents.tool_format import (
    DEFAULT_TOOL_FORMAT,
    TOOL_FORMATS,
    get_tool_format,
    resolve_tool_format,
    template_supports_tools,
)
from entrogym.envs.tools import AgentMessage, ToolCall
from entrogym.models import resolve_model

# A ChatML template that renders tools (Hermes style), for the "template" format.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}"
    "{{ messages[0].content }}\n{% endif %}Tools:\n{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if not (tools and loop.first and m.role == 'system') %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def tools():
    return PhoneEnv().reset(options={"task_id": "bob"})[1]["tools"]


WELL_FORMED = {
    "call": 'find_contact(name="Bob")',
    "json": '<tool_call>\n{"name": "find_contact", "arguments": {"name": "Bob"}}\n</tool_call>',
}
WELL_FORMED["template"] = WELL_FORMED["json"]


def calls_text(fmt: str, *calls: ToolCall) -> str:
    return "\n".join(get_tool_format(fmt).render_call(c) for c in calls)


@pytest.mark.parametrize("fmt", list(TOOL_FORMATS))
def test_render_call_is_what_parse_reads(fmt, tools):
    f = get_tool_format(fmt)
    for call in [
        ToolCall("find_contact", {"name": 'O\'Neil "Bob"\n'}),
        ToolCall("send_message", {"phone": "555", "text": "héllo", "urgent": True}),
        ToolCall("complete_task", {}),
        ToolCall("buy", {"items": [1, 2.5, None, {"a": [False]}]}),
    ]:
        assert f.parse(f.render_call(call), tools) == AgentMessage("", [call])


@pytest.mark.parametrize("fmt", list(TOOL_FORMATS))
def test_well_formed_call_with_text_around_it(fmt, tools):
    f = get_tool_format(fmt)
    message = f.parse(f"Let me look.\n{WELL_FORMED[fmt]}\n", tools)
    assert message == AgentMessage("Let me look.", [ToolCall("find_contact", {"name": "Bob"})])
    assert f.parse("done", tools) == AgentMessage("done")


@pytest.mark.parametrize(
    ("fmt", "text", "words"),
    [
        ("call", "find_contact(name=Bob)", "not a literal"),
        ("call", 'find_contact(name="Bob"', "ends with ')'"),
        ("call", 'find_contact(name="Bob", name="Al")', "given twice"),
        ("call", "find_contact(**{'name': 'Bob'})", "literals"),
        ("call", "find_contact(name=__import__('os').getcwd())", "not a literal"),
        ("call", "find_contact(name={1, 2})", "not a literal"),
        # two calls joined by an operator parse as one expression, not as a call
        ("call", 'find_contact(name="a") + send_message(x=1)', "one call per line"),
        ("call", "find_contact(a) or send_message(b)", "one call per line"),
        ("json", "<tool_call>{name: find_contact}</tool_call>", "cannot read"),
        ("json", '<tool_call>{"arguments": {}}</tool_call>', "cannot read"),
        ("json", '<tool_call>{"name": "x", "arguments": [1]}</tool_call>', "not a mapping"),
    ],
)
def test_malformed_calls_are_parse_errors_naming_the_format(fmt, text, words, tools):
    message = get_tool_format(fmt).parse(text, tools)
    assert message.tool_calls == [] and words in message.parse_error
    help_text = "tool_name(arg=" if fmt == "call" else "<tool_call>"
    assert help_text in message.parse_error


def test_call_format_details(tools):
    f = get_tool_format("call")
    # positional arguments follow the tool's parameters; quoting and a full stop are forgiven
    assert f.parse('`send_message("555", "hi")`.', tools).tool_calls == [
        ToolCall("send_message", {"phone": "555", "text": "hi"})
    ]
    assert "name the arguments" in f.parse('fly("x")', tools).parse_error
    assert f.parse("Sure (I will).", tools) == AgentMessage("Sure (I will).")
    # a line that starts like prose is text, not a call
    assert f.parse('I will call find_contact(name="Bob")', tools).tool_calls == []


def test_json_format_details():
    f = get_tool_format("json")
    # arguments as a JSON string (some models) and Llama 3's "parameters"; an unclosed block
    text = ('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
            '<tool_call>{"name": "b", "parameters": {"y": 2}}</tool_call>'
            '<tool_call>{"name": "c", "arguments": {}}')  # fmt: skip
    assert f.parse(text).tool_calls == [
        ToolCall("a", {"x": 1}),
        ToolCall("b", {"y": 2}),
        ToolCall("c", {}),
    ]


@pytest.mark.parametrize("fmt", list(TOOL_FORMATS))
@pytest.mark.parametrize(
    ("calls", "observation", "errors"),
    [
        ([ToolCall("find_contact", {"name": "Bob"})], "555-0101", 0),
        ([ToolCall("fly", {"to": "Paris"})], "unknown tool 'fly'", 1),
        ([ToolCall("find_contact", {"who": "Bob"})], "missing argument(s) name", 1),
        ([ToolCall("find_contact", {"name": 7})], "must be string", 1),
        ([ToolCall("find_contact", {"name": "Zed"})], "find_contact raised KeyError", 1),
    ],
)
def test_each_format_end_to_end_through_the_env(fmt, calls, observation, errors, tools):
    """Sampled text -> the format's parse -> the env's answer: right, unknown tool, bad
    arguments, a tool that raises."""
    env = PhoneEnv()
    env.reset(options={"task_id": "bob"})
    message = get_tool_format(fmt).parse(calls_text(fmt, *calls), tools)
    obs, _, done, _, info = env.step(message.to_action())
    assert observation in obs and not done
    assert (info["tool_calls"], info["tool_errors"]) == (len(calls), errors)


def test_default_format_follows_the_template():
    assert template_supports_tools(TOOLS_TEMPLATE)
    assert not template_supports_tools("{{ messages }}")
    assert resolve_tool_format(None, TOOLS_TEMPLATE).name == "template"
    assert resolve_tool_format(None, "{{ messages }}").name == DEFAULT_TOOL_FORMAT
    assert resolve_tool_format("json", TOOLS_TEMPLATE).name == "json"
    with pytest.raises(ValueError, match="--tool-format"):
        resolve_tool_format("template", "{{ messages }}")
    with pytest.raises(ValueError, match="tool_format"):
        get_tool_format("xml")


@pytest.mark.parametrize("fmt", ["call", "json"])
def test_smollm2_prompt_with_tools_and_demonstration(tokenizer, tools, fmt):
    """The shipped system block, the demonstration's calls in the format and its tool answers
    as ``tool`` messages, rendered by SmolLM2's own template."""
    agent = LLMAgent(tokenizer, system_prompt="Be brief.", tool_format=fmt)
    t = agent.start("Send 'hi' to Bob.", "bob", tools, demonstration())
    f = get_tool_format(fmt)
    system = "Be brief.\n\n" + f.system_block(tools)
    expected = [{"role": "system", "content": system}]
    for m in demonstration():
        content = m["content"]
        if m.get("tool_calls"):
            content = f.render_call(ToolCall.from_json(m["tool_calls"][0]))
        expected.append({"role": m["role"], "content": content})
    expected.append({"role": "user", "content": "Send 'hi' to Bob."})
    text = tokenizer.decode(t.token_ids)
    assert text == tokenizer.apply_chat_template(
        expected, tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>tool\n555-0199<|im_end|>" in text
    assert "find_contact" in system and "send_message" in system
    # the tools' answers come back as tool messages; the ids are the template's suffix
    call = tokenizer(WELL_FORMED[fmt], add_special_tokens=False)["input_ids"]
    end = agent.add_completion(
        t, Completion([*call, agent.eot_ids[0]], [-1.0] * (len(call) + 1), "stop")
    )
    assert AgentMessage.from_action(end.text).tool_calls == [
        ToolCall("find_contact", {"name": "Bob"})
    ]
    assert agent.add_feedback(t, "555-0101")
    expected += [
        {"role": "assistant", "content": WELL_FORMED[fmt]},
        {"role": "tool", "content": "555-0101"},
    ]
    full = tokenizer.apply_chat_template(expected, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(t.token_ids) == full
    assert t.token_ids == tokenizer(full, add_special_tokens=False)["input_ids"]


def test_call_format_block_lists_signatures(tools):
    block = get_tool_format("call").system_block(tools)
    assert "find_contact(name: str) - Look up a contact's phone number by name." in block
    assert "send_message(phone: str, text: str, urgent: bool = False)" in block


def test_template_format_renders_tools_through_the_template(tokenizer, tools):
    agent = LLMAgent(tokenizer, chat_template=TOOLS_TEMPLATE, system_prompt="Be brief.")
    assert agent.tool_format.name == "template"
    t = agent.start("Send 'hi' to Bob.", "bob", tools)
    text = tokenizer.decode(t.token_ids)
    assert text.startswith("<|im_start|>system\nBe brief.\nTools:\n{") and '"find_contact"' in text
    call = tokenizer(WELL_FORMED["template"], add_special_tokens=False)["input_ids"]
    end = agent.add_completion(
        t, Completion([*call, agent.eot_ids[0]], [0.0] * (len(call) + 1), "stop")
    )
    assert end.message.tool_calls == [ToolCall("find_contact", {"name": "Bob"})]
    assert agent.add_feedback(t, "555-0101")
    assert tokenizer.decode(t.token_ids).endswith(
        "<|im_start|>tool\n555-0101<|im_end|>\n<|im_start|>assistant\n"
    )


def test_markers_that_are_special_tokens_are_kept(tokenizer, tools):
    """Qwen's ``<tool_call>`` is a token of its own: the action is decoded with it."""
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    agent = LLMAgent(tok, tool_format="json")
    t = agent.start("Send 'hi' to Bob.", "bob", tools)
    ids = tok(WELL_FORMED["json"], add_special_tokens=False)["input_ids"]
    assert tok.convert_tokens_to_ids("<tool_call>") in ids
    end = agent.add_completion(
        t, Completion([*ids, agent.eot_ids[0]], [0.0] * (len(ids) + 1), "stop")
    )
    assert end.message == AgentMessage("", [ToolCall("find_contact", {"name": "Bob"})])
    assert t.actions == [WELL_FORMED["json"]]


def test_feedback_role_option(tokenizer, tools):
    user = LLMAgent(tokenizer, feedback_role="user")
    t = user.start("Send 'hi' to Bob.", "bob", tools, demonstration())
    assert "<|im_start|>tool" not in tokenizer.decode(t.token_ids)  # demo answers as user
    assert tokenizer.decode(user.feedback_ids("x", t)).startswith("<|im_start|>user\nx")
    auto = LLMAgent(tokenizer)
    plain = auto.start("Hi")
    assert tokenizer.decode(auto.feedback_ids("x", plain)).startswith("<|im_start|>user\nx")
    with pytest.raises(ValueError, match="feedback_role"):
        LLMAgent(tokenizer, feedback_role="system")
    with pytest.raises(ValueError, match="max_turns"):
        LLMAgent(tokenizer, max_turns=0)


def test_env_without_tools_keeps_raw_text_actions(tokenizer):
    agent = LLMAgent(tokenizer)
    t = agent.start("Hi")
    ids = tokenizer('find_contact(name="Bob")', add_special_tokens=False)["input_ids"]
    end = agent.add_completion(
        t, Completion([*ids, agent.eot_ids[0]], [0.0] * (len(ids) + 1), "stop")
    )
    assert end.text == 'find_contact(name="Bob")' and end.message is None
