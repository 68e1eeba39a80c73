"""LLMAgent: chat-template ids, token-exactness across turns, budgets, bad input.

The multi-turn episodes run SmolLM2-135M-Instruct through the ``hf`` engine (a real model that
ends its turns itself, so both the "stopped" and the "budget hit" paths occur).
"""

from __future__ import annotations

import pytest
from mask_runs import runs
from transformers import AutoTokenizer

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.agents.engines.base import Completion
from entrogym.agents.rollout import collect_rollouts
from entrogym.envs.base import TextEnv, Turn
from entrogym.models import resolve_model

SMOLLM2 = "smollm2-135m-instruct"


class ChatEnv(TextEnv):
    """Three-turn chat: each action gets feedback that quotes its length; reward 1 at the end."""

    splits = ("train",)

    def __init__(self) -> None:
        super().__init__(max_turns=3)

    def task_ids(self, split: str | None = None) -> list[str]:
        return ["count", "colour"]

    def _start_task(self, task_id: str) -> tuple[str, dict]:
        prompts = {"count": "Count from 1 to 3.", "colour": "Name a colour."}
        return prompts[task_id], {}

    def _respond(self, action: str) -> Turn:
        if self._turn + 1 >= 3:
            return Turn("bye", done=True, reward=1.0, success=True)
        return Turn(feedback(self._turn + 1, action))


def feedback(turn: int, action: str) -> str:
    return f"Turn {turn}: you wrote {len(action)} characters. Say it differently."


class Recorder:
    """Wraps an engine and keeps every (prompt, completion) it served."""

    def __init__(self, engine):
        self.engine, self.max_model_len, self.calls = engine, engine.max_model_len, []

    def generate(self, prompts, params, adapter=None):
        out = self.engine.generate(prompts, params, adapter)
        self.calls += [(tuple(p), c) for p, c in zip(prompts, out, strict=True)]
        return out


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(SMOLLM2))


def test_template_pieces(tokenizer):
    agent = LLMAgent(tokenizer, system_prompt="Be brief.")
    assert tokenizer.convert_ids_to_tokens(agent.eot_ids) == ["<|im_end|>", "Ċ"]
    assert agent.stop_token_ids[0] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    delta = agent.feedback_ids("3 + 4 = 7?")
    assert (
        tokenizer.decode(delta) == "<|im_start|>user\n3 + 4 = 7?<|im_end|>\n<|im_start|>assistant\n"
    )
    tool = LLMAgent(tokenizer, feedback_role="tool")
    assert tokenizer.decode(tool.feedback_ids("x")).startswith("<|im_start|>tool\nx")
    t = agent.start("Hi")
    assert tokenizer.decode(t.token_ids) == tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert t.action_mask == [0] * len(t.token_ids)


def test_budget_cut_turn_is_closed_with_end_of_turn_ids(tokenizer):
    agent = LLMAgent(tokenizer, max_turn_tokens=3, max_context=200)
    t = agent.start("Hi")
    sampled = tokenizer("Hello there friend", add_special_tokens=False)["input_ids"][:3]
    end = agent.add_completion(t, Completion(sampled, [-1.0] * 3, "length"))
    assert end is not None and end.limit == "turn"
    assert agent.add_feedback(t, "More.")
    n = t.prompt_len
    assert t.token_ids[n : n + 3] == sampled and t.action_mask[n : n + 3] == [1, 1, 1]
    closing = t.token_ids[n + 3 :]
    assert closing[:2] == agent.eot_ids and set(t.action_mask[n + 3 :]) == {0}
    assert agent.turn_budget(t) == 3


def test_chunked_turn_continues_until_budget(tokenizer):
    agent = LLMAgent(tokenizer, max_turn_tokens=4, max_context=200)
    t = agent.start("Hi")
    assert agent.add_completion(t, Completion([100, 101], [-1.0, -1.0], "length")) is None
    assert agent.turn_budget(t) == 2
    end = agent.add_completion(t, Completion([102, 103], [-1.0, -1.0], "length"))
    assert end is not None and end.limit == "turn" and t.num_turns == 1


def test_context_limit_truncates(tokenizer):
    agent = LLMAgent(tokenizer, max_turn_tokens=50, max_context=60)
    t = agent.start("Hi")
    room = agent.turn_budget(t)
    assert room == 60 - t.prompt_len
    end = agent.add_completion(t, Completion([100] * room, [-1.0] * room, "length"))
    assert end is not None and end.limit == "context"
    assert not agent.add_feedback(t, "more")  # no room: the episode must end
    assert len(t.token_ids) == 60


def test_no_chat_template_names_the_option(tokenizer):
    bare = AutoTokenizer.from_pretrained(resolve_model(SMOLLM2))
    bare.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        LLMAgent(bare)
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    agent = LLMAgent(bare, chat_template=template)
    assert (
        bare.decode(agent.start("Hi").token_ids)
        == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_prompt_longer_than_context_is_a_clear_error(tokenizer):
    agent = LLMAgent(tokenizer, max_context=20)
    with pytest.raises(ValueError, match="max_context=20"):
        agent.start("word " * 50, task_id="long")


def test_bad_options(tokenizer):
    with pytest.raises(ValueError, match="on_turn_budget"):
        LLMAgent(tokenizer, on_turn_budget="ignore")
    with pytest.raises(ValueError, match="eot_token"):
        LLMAgent(tokenizer, eot_token="<|im_start|>x")


@pytest.mark.slow
def test_multi_turn_episodes_are_token_exact(tokenizer):
    engine = make_engine("hf", SMOLLM2, dtype="fp32", max_model_len=1024, seed=3)
    rec = Recorder(engine)
    agent = LLMAgent(tokenizer, max_turn_tokens=12, max_context=1024, on_turn_budget="step")
    episodes = collect_rollouts(
        ChatEnv, ["count", "colour"], rec, agent, k=2, sampling=SamplingParams(temperature=1.0)
    )
    assert len(episodes) == 4
    served = {(p, tuple(c.token_ids)): c for p, c in rec.calls}
    limits = set()
    for ep in episodes:
        assert ep.num_turns == 3 and ep.reward == 1.0 and not ep.truncated
        ids, mask = ep.token_ids, ep.action_mask
        stretches = runs(mask)
        assert len(stretches) == 3
        # Every sampled stretch is exactly one engine completion for exactly that prefix.
        contents = []
        for a, b in stretches:
            c = served[(tuple(ids[:a]), tuple(ids[a:b]))]
            assert ep.sampler_logprobs[a:b] == c.logprobs
            stopped = c.token_ids[-1] == agent.eot_ids[0]
            limits.add(stopped)
            contents.append(tokenizer.decode(c.token_ids[:-1] if stopped else c.token_ids))
        assert all(lp == 0.0 for lp, m in zip(ep.sampler_logprobs, mask, strict=True) if not m)
        # The ids decode to the template's own rendering of the conversation.
        messages = [{"role": "user", "content": ChatEnv()._start_task(ep.task_id)[0]}]
        for turn, (content, action) in enumerate(
            zip(contents[:-1], ep.info["actions"], strict=False)
        ):
            messages += [
                {"role": "assistant", "content": content},
                {"role": "user", "content": feedback(turn + 1, action)},
            ]
        a, b = stretches[-1]
        expected = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        assert tokenizer.decode(ids[:a]) == expected
        # Feedback ids are what the tokenizer makes of that text on its own (no merges across).
        for (_, b1), (a2, _) in zip(stretches, stretches[1:], strict=False):
            piece = ids[b1:a2]
            assert (
                tokenizer(tokenizer.decode(piece), add_special_tokens=False)["input_ids"] == piece
            )
    assert limits == {True, False}, "expected turns that stopped and turns cut by the budget"
    engine.close()
