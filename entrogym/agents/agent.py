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
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entrogym.agents.engines.base import Completion


def no_chat_template_message(tokenizer_name: str) -> str:
    """The one line that says a tokenizer has no chat template and how to give one."""
    return (
        f"the tokenizer of {tokenizer_name!r} has no chat template; pass one with "
        "--chat-template FILE (a Jinja file; examples/chat_templates/plain.jinja fits any "
        "tokenizer with an EOS token)"
    )


# Placeholder turns of the reference conversation from which template pieces are cut.
_REF_USER, _REF_ASSISTANT = "Hello.", "Hi."
ON_TURN_BUDGET = ("truncate", "step")


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

    @property
    def turn_tokens(self) -> int:
        return len(self.token_ids) - self.turn_start


@dataclass
class TurnEnd:
    """A finished turn: the decoded action and why it ended.

    ``limit`` is None when the model ended the turn itself, ``"turn"`` when ``max_turn_tokens``
    cut it and ``"context"`` when ``max_context`` did.
    """

    text: str
    limit: str | None = None


class LLMAgent:
    """Turns observations into prompt ids and completions into actions.

    Args:
        tokenizer: a Hugging Face tokenizer (use :meth:`from_model` to load one).
        system_prompt: system message of every episode; None = none (the template may add
            its default one).
        chat_template: a Jinja template (string or path to a file) for tokenizers without one,
            or to replace theirs.
        feedback_role: role of env feedback messages (``"user"`` or ``"tool"``).
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
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        system_prompt: str | None = None,
        chat_template: str | None = None,
        feedback_role: str = "user",
        max_turn_tokens: int = 1024,
        max_context: int = 4096,
        on_turn_budget: str = "truncate",
        eot_token: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        stop_token_ids: tuple[int, ...] = (),
    ) -> None:
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
        self.max_turn_tokens = max_turn_tokens
        self.max_context = max_context
        self.on_turn_budget = on_turn_budget
        self.template_kwargs = dict(chat_template_kwargs or {})
        if (
            chat_template is not None
            and Path(chat_template).suffix
            and Path(chat_template).is_file()
        ):
            chat_template = Path(chat_template).read_text()
        self.chat_template = chat_template
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise ValueError(no_chat_template_message(name))
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

    def _head(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []

    def render_ids(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        """The template's rendering of ``messages``, tokenized once as a whole."""
        text = self.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=self.chat_template,
            **self.template_kwargs,
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

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

    def feedback_ids(self, observation: str) -> list[int]:
        """Ids that follow an assistant turn's end-of-turn ids when the env answers
        ``observation``: the new message and the next generation prompt."""
        ref = [
            *self._head(),
            {"role": "user", "content": _REF_USER},
            {"role": "assistant", "content": _REF_ASSISTANT},
        ]
        full = self.render_ids([*ref, {"role": self.feedback_role, "content": observation}], True)
        start = len(self.render_ids(ref[:-1], add_generation_prompt=True))
        # The reference assistant turn ends at the first end-of-turn ids after its start.
        for i in range(start, len(full) - len(self.eot_ids) + 1):
            if full[i : i + len(self.eot_ids)] == self.eot_ids:
                return full[i + len(self.eot_ids) :]
        raise ValueError(
            "the chat template's rendering of a feedback turn does not follow the assistant's "
            "end-of-turn ids; pass a chat_template or eot_token that fits"
        )

    # ----- one episode ----------------------------------------------------------------------

    def start(self, observation: str, task_id: str = "") -> Transcript:
        ids = self.render_ids([*self._head(), {"role": "user", "content": observation}], True)
        if len(ids) >= self.max_context:
            raise ValueError(
                f"the prompt of task {task_id!r} has {len(ids)} tokens, which leaves no room "
                f"within max_context={self.max_context}; raise max_context or shorten the prompt"
            )
        return Transcript(list(ids), [0] * len(ids), [0.0] * len(ids), len(ids), len(ids))

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
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        t.num_turns += 1
        t.actions.append(text)
        t.finish_reasons.append(limit or "stop")
        return TurnEnd(text, limit)

    def add_feedback(self, t: Transcript, observation: str) -> bool:
        """Close the turn and append the env's answer; False if it leaves no room to generate
        (the episode is then truncated and ``t`` unchanged)."""
        last = t.token_ids[-1] if t.token_ids else None
        close = self.eot_ids[1:] if last == self.eot_ids[0] else self.eot_ids
        piece = close + self.feedback_ids(observation)
        if len(t.token_ids) + len(piece) >= self.max_context:
            return False
        t.token_ids += piece
        t.action_mask += [0] * len(piece)
        t.logprobs += [0.0] * len(piece)
        t.turn_start = len(t.token_ids)
        return True
