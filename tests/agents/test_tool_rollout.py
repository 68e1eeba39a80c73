"""Episodes with tool turns, through ``collect_rollouts``: token-exact (the learner scores the
very ids the sampler drew, and its log-probs equal a fresh forward over them), counted tool
calls and errors, tracebacks in the log file, the agent's ``max_turns``, a hanging tool
bounded by the env worker's time limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from forced_logprobs import teacher_forced_logprobs
from mask_runs import runs
from tool_envs import CONTACTS, TASKS, PhoneEnv

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.agents.engines.base import Completion
from entrogym.agents.rollout import collect_rollouts
from entrogym.agents.tool_format import get_tool_format
from entrogym.envs.tools import ToolCall
from entrogym.models import resolve_model
from entrogym.train.batch import collate_episodes
from entrogym.train.learner.logprobs import sequence_logprobs
from entrogym.train.learner.policy import load_base_model, load_policy

TINY = "tiny-random-llama"  # SmolLM2's tokenizer and chat template, a 2-layer random body


def script(task: str) -> list[ToolCall]:
    """The forced calls of a task's first two turns: Ann's episode first calls a tool that
    raises (an unknown contact)."""
    text, name = TASKS[task]
    first = ToolCall("find_contact", {"name": "Zed" if task == "ann" else name})
    return [first, ToolCall("send_message", {"phone": CONTACTS[name], "text": text})]


class ScriptedEngine:
    """Forces each episode's first turns to the task's script (log-probs by a teacher-forced
    forward of ``model``), then samples from ``engine``; keeps every (prompt, completion)."""

    def __init__(self, agent: LLMAgent, engine=None, model=None, max_model_len: int = 2048):
        self.agent, self.engine, self.model = agent, engine, model
        self.max_model_len = engine.max_model_len if engine is not None else max_model_len
        self.calls: list[tuple[tuple[int, ...], Completion]] = []

    def forced(self, prompt: list[int]) -> Completion | None:
        text = self.agent.tokenizer.decode(prompt)
        task = next(t for t, (msg, name) in TASKS.items() if f"Send '{msg}' to {name}." in text)
        turn = text.split(f"to {TASKS[task][1]}.")[-1].count("<|im_start|>assistant") - 1
        calls = script(task)
        if turn >= len(calls):
            return None
        said = self.agent.tool_format.render_call(calls[turn])
        ids = [
            *self.agent.tokenizer(said, add_special_tokens=False)["input_ids"],
            self.agent.eot_ids[0],
        ]
        if self.model is None:
            return Completion(ids, [-1.0] * len(ids), "stop")
        return Completion(ids, teacher_forced_logprobs(self.model, list(prompt), ids), "stop")

    def generate(self, prompts, params, adapter=None):
        params = params if isinstance(params, list) else [params] * len(prompts)
        out = [self.forced(list(p)) for p in prompts]
        free = [i for i, c in enumerate(out) if c is None]
        if free:
            sampled = self.engine.generate(
                [prompts[i] for i in free], [params[i] for i in free], adapter
            )
            for i, c in zip(free, sampled, strict=True):
                out[i] = c
        self.calls += [(tuple(p), c) for p, c in zip(prompts, out, strict=True)]
        return out


@pytest.fixture(scope="module")
def tiny():
    return load_base_model(TINY)


@pytest.mark.parametrize("fmt", ["call", "json"])
def test_tool_episodes_are_token_exact(fmt: str, tiny, tmp_path: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(TINY))
    agent = LLMAgent(tokenizer, tool_format=fmt, max_turn_tokens=8, max_context=2048,
                     on_turn_budget="step")  # fmt: skip
    engine = make_engine("hf", TINY, dtype="fp32", max_model_len=2048, seed=5)
    rec = ScriptedEngine(agent, engine, tiny)
    log = tmp_path / "tool_errors.jsonl"
    episodes = collect_rollouts(
        lambda: PhoneEnv(demonstration=True), ["ann", "bob"], rec, agent, k=2,
        sampling=SamplingParams(temperature=1.0), tool_error_log=log,
    )  # fmt: skip
    engine.close()
    assert len(episodes) == 4
    served = {(p, tuple(c.token_ids)): c for p, c in rec.calls}
    fmt_ = get_tool_format(fmt)
    for ep in episodes:
        # two scripted tool turns, then sampled turns until one without a (readable) call
        actions = ep.info["actions"]
        assert actions[:2] == [fmt_.render_call(c) for c in script(ep.task_id)]
        assert ep.reward == 1.0 and ep.info["end_reason"] == "done" and ep.num_turns >= 3
        assert "tool_tracebacks" not in ep.info and "tools" not in ep.info
        stretches = runs(ep.action_mask)
        assert len(stretches) == ep.num_turns
        for a, b in stretches:  # each stretch: one completion, for exactly that prefix
            c = served[(tuple(ep.token_ids[:a]), tuple(ep.token_ids[a:b]))]
            assert ep.sampler_logprobs[a:b] == c.logprobs
        # replayed on a fresh env, the actions give the same answers and counts, and the ids
        # up to the last turn are the template's rendering of that conversation
        env = PhoneEnv(demonstration=True)
        first, info = env.reset(options={"task_id": ep.task_id})
        messages = [{"role": "system", "content": fmt_.system_block(info["tools"])}]
        messages += agent.demonstration_messages(info["demonstration"])
        messages.append({"role": "user", "content": first})
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert (
            ep.token_ids[: stretches[0][0]]
            == tokenizer(prompt, add_special_tokens=False)["input_ids"]
        )
        calls = errors = 0
        for text in actions:
            answer, _, done, _, step = env.step(fmt_.parse(text, info["tools"]).to_action())
            calls, errors = calls + step["tool_calls"], errors + step["tool_errors"]
            if not done:
                messages += [{"role": "assistant", "content": text},
                             {"role": "tool", "content": answer}]  # fmt: skip
        assert done and (ep.info["tool_calls"], ep.info["tool_errors"]) == (calls, errors)
        assert errors >= (1 if ep.task_id == "ann" else 0)
        expected = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        assert tokenizer.decode(ep.token_ids[: stretches[-1][0]]) == expected
        for (_, b1), (a2, _) in zip(stretches, stretches[1:], strict=False):
            piece = ep.token_ids[b1:a2]  # feedback ids: what the tokenizer makes of that text
            assert (
                tokenizer(tokenizer.decode(piece), add_special_tokens=False)["input_ids"] == piece
            )
    # the learner's log-probs of the collated (padded) batch equal a fresh forward of each episode
    policy = load_policy(TINY, seed=0)
    batch = collate_episodes(list(episodes))
    with torch.no_grad():
        learner = sequence_logprobs(policy, batch.input_ids, batch.attention_mask,
                                    score_mask=batch.mask, layout="trimmed")  # fmt: skip
    for i, ep in enumerate(episodes):
        fresh = [0.0, *teacher_forced_logprobs(tiny, ep.token_ids[:1], ep.token_ids[1:])]
        positions = [j for j, m in enumerate(ep.action_mask) if m]
        for j in positions:
            assert learner[i, j].item() == pytest.approx(fresh[j], abs=1e-5)
            assert ep.sampler_logprobs[j] == pytest.approx(fresh[j], abs=1e-4)
    # the raising tool's traceback went to the log, once per Ann episode
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["task_id"], r["tool"], r["turn"]) for r in lines] == [("ann", "find_contact", 1)] * 2
    assert all("KeyError" in r["traceback"] for r in lines)


def test_agent_max_turns_ends_episodes_graded_as_left(tmp_path: Path, capfd):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(TINY))
    agent = LLMAgent(tokenizer, max_turns=1, max_context=2048)
    episodes = collect_rollouts(PhoneEnv, ["ann", "bob"], ScriptedEngine(agent), agent, k=1)
    for ep in episodes:
        assert ep.num_turns == 1 and ep.truncated and ep.info["end_reason"] == "max_turns"
        assert ep.info["truncated_by"] == "max_turns" and ep.reward == 0.0
    assert episodes.stats["tool_calls"] == 2 and episodes.stats["tool_errors"] == 1
    # without a log file the traceback stays with its episode; nothing reaches the console
    (ann,) = [e for e in episodes if e.task_id == "ann"]
    assert "KeyError" in ann.info["tool_tracebacks"][0]["traceback"]
    assert "Traceback" not in capfd.readouterr().err


def test_the_envs_own_turn_limit_applies_too():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(TINY))
    agent = LLMAgent(tokenizer, max_context=2048)
    episodes = collect_rollouts(
        lambda: PhoneEnv(max_turns=2), ["bob"], ScriptedEngine(agent), agent, k=1
    )
    (ep,) = episodes
    assert ep.num_turns == 2 and ep.info["end_reason"] == "max_turns" and ep.reward == 1.0


def test_a_hanging_tool_is_bounded_by_the_env_timeout():
    """``wait(seconds=600)`` runs in an env worker: the call's time limit fails the episode as
    an env error and the worker is replaced."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(TINY))
    agent = LLMAgent(tokenizer, max_context=2048)

    class Hang(ScriptedEngine):
        def forced(self, prompt):
            ids = [
                *tokenizer("wait(seconds=600)", add_special_tokens=False)["input_ids"],
                agent.eot_ids[0],
            ]
            return Completion(ids, [-1.0] * len(ids), "stop")

    episodes = collect_rollouts("tool_envs:ToolSlow-v0", ["bob"], Hang(agent), agent, k=1,
                                env_workers=1, env_timeout=3)  # fmt: skip
    (ep,) = episodes
    assert ep.failed and "--env-timeout" in ep.error and ep.info["end_reason"] == "error"
    assert episodes.stats["env_errors"] == 1
