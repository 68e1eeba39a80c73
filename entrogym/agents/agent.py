"""LLMAgent: an env's observations as chat-template token ids, token-exact across turns.

A conversation is built as ids, never as text to re-tokenize:

* the first prompt is the template's rendering of ``[system?, user(observation)]`` with the
  generation prompt;
* each sampled completion is appended as the engine returned it (action mask 1);
* if the completion did not end with the template's end-of-turn token (the budget cut it),
  the end-of-turn ids are appended (mask 0); otherwise only what the template puts after that
  token (e.g. SmolLM2's ``"\\n"`` after ``<|im_end|>``);
* env feedback is the template's rendering of the new user/tool message plus the next
  generation prompt, taken as the id suffix of a rendered reference conversation (mask 0).

An episode of an env with tools (its reset info has ``"tools"``) renders them in its first
prompt with the agent's tool format (:mod:`entrogym.agents.tool_format`): through the
template's own ``tools=`` or as a block of the system message, the same in the reference
conversations, so the feedback ids stay a suffix of the template's rendering. A worked example
from the env (``"demonstration"``) goes between the system message and the task. Its turns'
text is decoded with special tokens kept (a format's markers may be special tokens), parsed into
an :class:`~entrogym.envs.tools.AgentMessage` and sent to the env as its JSON action; the env's
answers are ``tool`` messages unless ``feedback_role`` says otherwise.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entrogym.agents.engines.base import Completion
from entrogym.agents.tool_format import resolve_tool_format
from entrogym.envs.tools import AgentMessage, ToolCall


def no_chat_template_message(tokenizer_name: str) -> str:
    """The one line that says a tokenizer has no chat template and how to give one."""
    return (
        f"the tokenizer of {tokenizer_name!r} has no chat template; pass one with "
        "--chat-template FILE (a Jinja file; examples/chat_templates/plain.jinja fits any "
        "tokenizer with an EOS token)"
    )


def _is_template_file(value: str) -> bool:
    """Whether ``value`` names a template file (else it is the template itself, which may be
    too long for a file name)."""
    try:
        return bool(Path(value).suffix) and Path(value).is_file()
    except OSError:
        return False


# Placeholder turns of the reference conversation from which template pieces are cut.
_REF_USER, _REF_ASSISTANT = "Hello.", "Hi."
ON_TURN_BUDGET = ("truncate", "step")
FEEDBACK_ROLES = ("user", "tool")
Message = dict[str, Any]


@dataclass
class Transcript:
    """One episode's conversation so far; ``turn_start`` is where the current turn's ids begin."""

    token_ids: list[int]
    action_mask: list[int]
    logprobs: list[float]
    prompt_len: int
    turn_start: int
    num_turns: int = 0
    actions: list[str] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    head: list[Message] = field(default_factory=list)  # the episode's system message, if any
    tools: list[dict[str, Any]] | None = None  # the env's tool schemas; None: an env without

    @property
    def turn_tokens(self) -> int:
        return len(self.token_ids) - self.turn_start


@dataclass
class TurnEnd:
    """A finished turn: the decoded action and why it ended.

    ``limit`` is None when the model ended the turn itself, ``"turn"`` when ``max_turn_tokens``
    cut it and ``"context"`` when ``max_context`` did. ``text`` is the action the env gets: the
    decoded turn, or for an env with tools ``message`` as JSON.
    """

    text: str
    limit: str | None = None
    message: AgentMessage | None = None


class LLMAgent:
    """Turns observations into prompt ids and completions into actions.

    Args:
        tokenizer: a Hugging Face tokenizer (use :meth:`from_model` to load one).
        system_prompt: system message of every episode; None = none (the template may add
            its default one).
        chat_template: a Jinja template (string or path to a file) for tokenizers without one,
            or to replace theirs.
        feedback_role: role of env feedback messages, ``"user"`` or ``"tool"``; None = ``tool``
            for envs with tools, ``user`` for the others.
        max_turn_tokens: tokens one turn may sample.
        max_context: tokens the whole episode may hold (prompt, actions and feedback).
        on_turn_budget: ``"truncate"`` ends an episode whose turn hit ``max_turn_tokens`` as
            truncated (reward 0, the env is not stepped); ``"step"`` sends the cut action to the
            env (flagged with ``flag_action_truncated``) and goes on.
        eot_token: the template's end-of-turn token; None = the last special token of a
            rendered assistant turn (``<|im_end|>`` for SmolLM2 and Qwen3).
        chat_template_kwargs: extra template variables (e.g. ``enable_thinking``).
        stop_token_ids: more ids that end a turn (:meth:`from_model` adds the model's EOS ids
            from its config, e.g. Qwen3's two).
        tool_format: how tools are shown and calls read (:mod:`entrogym.agents.tool_format`):
            ``template``, ``json`` or ``call``; None = ``template`` where the chat template
            renders tools, else :data:`~entrogym.agents.tool_format.DEFAULT_TOOL_FORMAT`.
        max_turns: actions per episode before the rollout ends it (graded as the env's
            ``end_episode`` says); None = the env's own limit only.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        system_prompt: str | None = None,
        chat_template: str | None = None,
        feedback_role: str | None = None,
        max_turn_tokens: int = 1024,
        max_context: int = 4096,
        on_turn_budget: str = "truncate",
        eot_token: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        stop_token_ids: tuple[int, ...] = (),
        tool_format: str | None = None,
        max_turns: int | None = None,
    ) -> None:
        if feedback_role not in (*FEEDBACK_ROLES, None):
            raise ValueError(
                f"feedback_role must be one of {list(FEEDBACK_ROLES)} or None, got {feedback_role!r}"
            )
        if max_turns is not None and (isinstance(max_turns, bool) or max_turns < 1):
            raise ValueError(f"max_turns must be >= 1 or None, got {max_turns!r}")
        if max_turn_tokens < 1 or max_context < 2:
            raise ValueError(
                f"max_turn_tokens must be >= 1 and max_context >= 2, got {max_turn_tokens} "
                f"and {max_context}"
            )
        if on_turn_budget not in ON_TURN_BUDGET:
            raise ValueError(
                f"on_turn_budget must be one of {ON_TURN_BUDGET}, got {on_turn_budget!r}"
            )
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.feedback_role = feedback_role
        self.max_turns = max_turns
        self.max_turn_tokens = max_turn_tokens
        self.max_context = max_context
        self.on_turn_budget = on_turn_budget
        self.template_kwargs = dict(chat_template_kwargs or {})
        if chat_template is not None and _is_template_file(chat_template):
            chat_template = Path(chat_template).read_text()
        self.chat_template = chat_template
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise ValueError(no_chat_template_message(name))
        self.tool_format = resolve_tool_format(
            tool_format, chat_template or tokenizer.chat_template
        )
        self.eot_ids = self._end_of_turn_ids(eot_token)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop_token_ids = tuple(
            dict.fromkeys([self.eot_ids[0], *([eos] if eos is not None else []), *stop_token_ids])
        )

    @classmethod
    def from_model(cls, model: str, **kwargs: Any) -> LLMAgent:
        """An agent with the tokenizer of ``model`` (built-in name, folder or hub id); a turn
        also ends at the EOS ids of the model's generation config."""
        from transformers import AutoTokenizer

        from entrogym.models import model_limits, resolve_model

        path = resolve_model(model)
        if Path(path).is_dir() and "stop_token_ids" not in kwargs:
            kwargs["stop_token_ids"] = model_limits(path).eos_token_ids
        return cls(AutoTokenizer.from_pretrained(path), **kwargs)

    def with_turn_budget_rule(self, on_turn_budget: str) -> LLMAgent:
        """A copy of this agent (same tokenizer and template) with another turn-budget rule."""
        if on_turn_budget not in ON_TURN_BUDGET:
            raise ValueError(
                f"on_turn_budget must be one of {ON_TURN_BUDGET}, got {on_turn_budget!r}"
            )
        agent = copy.copy(self)
        agent.on_turn_budget = on_turn_budget
        return agent

    # ----- template pieces ------------------------------------------------------------------

    def _head(self, tools: list[dict[str, Any]] | None = None) -> list[Message]:
        """The system message of an episode with ``tools``: the system prompt and, unless the
        template renders tools itself, the tool format's block."""
        block = None
        if tools and not self.tool_format.uses_template_tools:
            block = self.tool_format.system_block(tools)
        system = "\n\n".join(part for part in (self.system_prompt, block) if part)
        return [{"role": "system", "content": system}] if system else []

    def render_ids(
        self,
        messages: list[Message],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """The template's rendering of ``messages`` (with ``tools`` where the template renders
        them), tokenized once as a whole."""
        extra = dict(self.template_kwargs)
        if tools and self.tool_format.uses_template_tools:
            extra["tools"] = tools
        text = self.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=self.chat_template,
            **extra,
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def feedback_role_of(self, t: Transcript | None) -> str:
        """The role env answers take in episode ``t``."""
        if self.feedback_role is not None:
            return self.feedback_role
        return "tool" if t is not None and t.tools is not None else "user"

    def demonstration_messages(self, demonstration: list[Message]) -> list[Message]:
        """An env's worked example as chat messages of this agent: assistant tool calls written
        in the tool format, tool answers in the feedback role (an env with tools: ``tool``
        unless ``feedback_role`` says otherwise)."""
        out = []
        for m in demonstration:
            role, content = m["role"], str(m.get("content") or "")
            if role == "assistant" and m.get("tool_calls"):
                calls = [
                    self.tool_format.render_call(ToolCall.from_json(c)) for c in m["tool_calls"]
                ]
                content = "\n".join([content, *calls] if content else calls)
            elif role == "tool":
                role = self.feedback_role or "tool"
            out.append({"role": role, "content": content})
        return out

    def _end_of_turn_ids(self, eot_token: str | None) -> list[int]:
        ref = [*self._head(), {"role": "user", "content": _REF_USER}]
        start = self.render_ids(ref, add_generation_prompt=True)
        full = self.render_ids([*ref, {"role": "assistant", "content": _REF_ASSISTANT}], False)
        if full[: len(start)] != start:
            raise ValueError(
                "the chat template renders an assistant turn that does not extend its generation "
                "prompt; pass a chat_template whose generation prompt starts each assistant turn"
            )
        rest = full[len(start) :]
        if eot_token is not None:
            eot = self.tokenizer.convert_tokens_to_ids(eot_token)
            if eot is None or eot not in rest:
                raise ValueError(
                    f"eot_token {eot_token!r} does not end the template's assistant turns"
                )
        else:
            special = set(getattr(self.tokenizer, "all_special_ids", []))
            found = [t for t in rest if t in special]
            if not found:
                raise ValueError(
                    "cannot find the end-of-turn token in the template's assistant turn; pass "
                    "eot_token (e.g. '<|im_end|>')"
                )
            eot = found[-1]
        return rest[len(rest) - 1 - rest[::-1].index(eot) :]

    def feedback_ids(self, observation: str, t: Transcript | None = None) -> list[int]:
        """Ids that follow an assistant turn's end-of-turn ids when the env answers
        ``observation`` in episode ``t``: the new message and the next generation prompt."""
        head, tools = (t.head, t.tools) if t is not None else (self._head(), None)
        ref = [
            *head,
            {"role": "user", "content": _REF_USER},
            {"role": "assistant", "content": _REF_ASSISTANT},
        ]
        answer = {"role": self.feedback_role_of(t), "content": observation}
        full = self.render_ids([*ref, answer], True, tools)
        start = len(self.render_ids(ref[:-1], True, tools))
        # The reference assistant turn ends at the first end-of-turn ids after its start.
        for i in range(start, len(full) - len(self.eot_ids) + 1):
            if full[i : i + len(self.eot_ids)] == self.eot_ids:
                return full[i + len(self.eot_ids) :]
        raise ValueError(
            "the chat template's rendering of a feedback turn does not follow the assistant's "
            "end-of-turn ids; pass a chat_template or eot_token that fits"
        )

    # ----- one episode ----------------------------------------------------------------------

    def start(
        self,
        observation: str,
        task_id: str = "",
        tools: list[dict[str, Any]] | None = None,
        demonstration: list[Message] | None = None,
    ) -> Transcript:
        """The first prompt of an episode: the system message (with ``tools``, the schemas of
        an env with tools), the env's ``demonstration`` if any, and ``observation``."""
        head = self._head(tools)
        t = Transcript([], [], [], 0, 0, head=head, tools=None if tools is None else list(tools))
        demo = self.demonstration_messages(demonstration) if demonstration else []
        messages = [*head, *demo, {"role": "user", "content": observation}]
        ids = self.render_ids(messages, True, tools)
        if len(ids) >= self.max_context:
            raise ValueError(
                f"the prompt of task {task_id!r} has {len(ids)} tokens, which leaves no room "
                f"within max_context={self.max_context}; raise max_context or shorten the prompt"
            )
        t.token_ids, t.action_mask, t.logprobs = list(ids), [0] * len(ids), [0.0] * len(ids)
        t.prompt_len = t.turn_start = len(ids)
        return t

    def turn_budget(self, t: Transcript) -> int:
        """Tokens the current turn may still sample."""
        return min(self.max_turn_tokens - t.turn_tokens, self.max_context - len(t.token_ids))

    def add_completion(self, t: Transcript, c: Completion) -> TurnEnd | None:
        """Append sampled ids; return the turn's end, or None if it goes on (a chunk ended)."""
        t.token_ids += c.token_ids
        t.action_mask += [1] * len(c.token_ids)
        t.logprobs += c.logprobs
        reason = c.finish_reason
        if reason == "length" and c.token_ids and c.token_ids[-1] in self.stop_token_ids:
            reason = "stop"  # the budget and the stop token arrived together
        if reason == "stop":
            limit = None
        elif t.turn_tokens >= self.max_turn_tokens:
            limit = "turn"
        elif len(t.token_ids) >= self.max_context:
            limit = "context"
        elif reason == "length" and c.token_ids:
            return None
        else:
            raise RuntimeError(f"the engine ended a turn with finish_reason={reason!r}")
        ids = t.token_ids[t.turn_start :]
        t.num_turns += 1
        t.finish_reasons.append(limit or "stop")
        if t.tools is None:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            t.actions.append(text)
            return TurnEnd(text, limit)
        # keep the markers a format reads (they may be special tokens); drop the turn's end
        end = len(ids)
        while end and ids[end - 1] in self.stop_token_ids:
            end -= 1
        text = self.tokenizer.decode(ids[:end], skip_special_tokens=False)
        t.actions.append(text)
        message = self.tool_format.parse(text, t.tools)
        return TurnEnd(message.to_action(), limit, message)

    def add_feedback(self, t: Transcript, observation: str) -> bool:
        """Close the turn and append the env's answer; False if it leaves no room to generate
        (the episode is then truncated and ``t`` unchanged)."""
        last = t.token_ids[-1] if t.token_ids else None
        close = self.eot_ids[1:] if last == self.eot_ids[0] else self.eot_ids
        piece = close + self.feedback_ids(observation, t)
        if len(t.token_ids) + len(piece) >= self.max_context:
            return False
        t.token_ids += piece
        t.action_mask += [0] * len(piece)
        t.logprobs += [0.0] * len(piece)
        t.turn_start = len(t.token_ids)
        return True
