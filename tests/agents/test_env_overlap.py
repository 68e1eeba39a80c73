"""Env steps beside generation (``collect_rollouts(overlap_env=...)``): the envs of the turns
one call ended step while the next call runs; the episodes stay token-exact, a seeded rollout
samples the same episodes whatever the envs' timings, whole-turn rollouts are those of the
lockstep loop, and early stopping keeps its rule."""

from __future__ import annotations

import random
import threading
import time

import pytest
from test_rollout import Steps  # tests/agents: episodes of 1 to 6 turns

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import make_engine
from entrogym.agents.engines.hf import HFEngine
from entrogym.agents.rollout import collect_rollouts, early_stop_reached
from entrogym.models import resolve_model

MODEL = "tiny-random-llama"
TASKS = ["t0", "t1"]


class Jittery(Steps):
    """:class:`Steps` whose steps take 0 to 30 ms, unseeded: timings differ run to run."""

    def _respond(self, action):
        time.sleep(random.random() * 0.03)
        return super()._respond(action)


class Intervals:
    """When engine calls and env steps ran, as (start, end) pairs."""

    lock = threading.Lock()
    generate: list[tuple[float, float]] = []
    env: list[tuple[float, float]] = []


class Slow(Steps):
    def _respond(self, action):
        start = time.perf_counter()
        time.sleep(0.05)
        with Intervals.lock:
            Intervals.env.append((start, time.perf_counter()))
        return super()._respond(action)


class SlowEngine(HFEngine):
    """Calls of 50 ms more, in which episode i's completion ends after one token where i plus
    its prompt's length is divisible by 3, as a model that ends its turn there: turns end in
    different calls."""

    def _generate_keyed(self, prompts, params, adapter, keys):
        start = time.perf_counter()
        time.sleep(0.05)
        out = super()._generate_keyed(prompts, params, adapter, keys)
        for prompt, key, c in zip(prompts, keys, out, strict=True):
            if (key[-1] + len(prompt)) % 3 == 0:
                c.token_ids, c.logprobs, c.finish_reason = c.token_ids[:1], c.logprobs[:1], "stop"
        Intervals.generate.append((start, time.perf_counter()))
        return out


@pytest.fixture(scope="module")
def engine():
    with make_engine("hf", MODEL, dtype="fp32", max_model_len=256, decode="static-cdf") as eng:
        yield eng


@pytest.fixture(scope="module")
def agent():
    return LLMAgent.from_model(MODEL, max_turn_tokens=6, max_context=256, on_turn_budget="step")


def _collect(env, engine, agent, **kwargs):
    with engine.seeded(0):
        return collect_rollouts(env, TASKS, engine, agent, k=4, seed=5, **kwargs)


def _tokens(episodes) -> list:
    return [(e.token_ids, e.action_mask, e.sampler_logprobs, e.reward) for e in episodes]


def test_whole_turn_rollouts_are_the_lockstep_ones(engine, agent):
    lockstep = _collect(Steps, engine, agent, early_stop=False, overlap_env=False)
    overlapped = _collect(Steps, engine, agent, early_stop=False, overlap_env=True)
    assert _tokens(overlapped) == _tokens(lockstep)
    assert overlapped.stats["steps"] == lockstep.stats["steps"]


def test_overlapped_chunks_sample_the_same_whatever_the_env_timings(engine, agent):
    runs = [
        _collect(Jittery, engine, agent, early_stop=False, chunk_tokens=2, overlap_env=True)
        for _ in range(2)
    ]
    assert _tokens(runs[0]) == _tokens(runs[1])
    assert max(e.num_turns for e in runs[0]) > 1
    for episode in runs[0]:  # token-exact: every sampled id has its log-prob, feedback none
        assert len(episode.token_ids) == len(episode.sampler_logprobs) == len(episode.action_mask)
        assert all(
            lp == 0.0
            for lp, m in zip(episode.sampler_logprobs, episode.action_mask, strict=True)
            if not m
        )


def test_env_steps_run_while_the_next_call_generates(agent):
    Intervals.generate, Intervals.env = [], []
    with SlowEngine(resolve_model(MODEL), max_model_len=256, decode="static-cdf") as slow:
        _collect(Slow, slow, agent, early_stop=False, chunk_tokens=2, overlap_env=True)
    overlapping = [
        e for e in Intervals.env if any(g0 < e[1] and e[0] < g1 for g0, g1 in Intervals.generate)
    ]
    assert len(overlapping) >= len(Intervals.env) // 2


def test_early_stopping_keeps_its_rule_when_envs_overlap(engine, agent):
    rule = {"min_done_per_task": 2, "min_done_fraction": 0.5}
    out = _collect(
        Jittery, engine, agent, chunk_tokens=2, overlap_env=True, keep_cancelled=True, **rule
    )
    cancelled = [e for e in out if e.info.get("cancelled")]
    assert cancelled  # the stragglers of 1 to 6 turns were cut
    done = [sum(not e.info.get("cancelled") for e in out if e.task_id == t) for t in TASKS]
    assert early_stop_reached(done, 4, 2, 0.5)
    assert out.stats["cancelled"] == len(cancelled)
