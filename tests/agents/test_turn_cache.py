"""The ``hf`` engine's cache kept across turns (``generate(..., cache_keys=...)``): a
conversation's next turn prefills only what it adds, and samples what a full prefill samples
(the same tokens under a seed, log-probs within fp32 rounding) over several turns with
conversations ending at different turns, on both static paths, on the decode kernels and on
torch's ops; another adapter version never reuses a kept cache."""

from __future__ import annotations

import pytest
from lora_policy import randomise_lora_b
from test_rollout import Steps  # tests/agents: episodes of 1 to 6 turns

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.agents.engines.turn_cache import Kept, KeptCaches, common_prefix
from entrogym.agents.rollout import collect_rollouts
from entrogym.models import resolve_model
from entrogym.train.learner.policy import LoraSettings, load_policy, save_adapter

MODEL = "tiny-random-llama"
# Conversation i ends after TURNS[i] turns: finishing is ragged; 0 and 3 share a first prompt
# (the K samples of a task), and all share an opening.
TURNS = [4, 1, 3, 4, 2, 4]
OPENING = [1, 5, 9, 13, 2, 6]
FIRST = [OPENING + t for t in ([7], [4, 4, 8], [2, 9, 9, 3], [7], [11, 12], [3])]


def _engine(decode: str, keep_cache: bool = True, **kwargs):
    return make_engine(
        "hf", MODEL, dtype="fp32", max_model_len=256, decode=decode, keep_cache=keep_cache,
        **kwargs,
    )  # fmt: skip


def _reply(i: int, turn: int) -> list[int]:
    """The env's answer to conversation ``i``'s turn: ids of a length of its own."""
    return [40 + i, 50 + turn, *range(60, 60 + (i + turn) % 4)]


def _converse(engine, adapters=(None,), seed: int = 0) -> list[list]:
    """Every conversation's completions, turn by turn, under ``cache_keys``; turn t samples
    with ``adapters[t % len(adapters)]``; per-prompt budgets differ, so rows of one call
    feed back different numbers of tokens."""
    prompts = [list(p) for p in FIRST]
    out: list[list] = [[] for _ in FIRST]
    with engine.seeded(seed):
        for turn in range(max(TURNS)):
            running = [i for i, n in enumerate(TURNS) if turn < n]
            params = [
                SamplingParams(temperature=1.0, max_tokens=3 + (i + turn) % 4) for i in running
            ]
            done = engine.generate(
                [prompts[i] for i in running],
                params,
                adapters[turn % len(adapters)],
                cache_keys=[("conversation", i) for i in running],
            )
            for i, c in zip(running, done, strict=True):
                out[i].append(c)
                prompts[i] += c.token_ids + _reply(i, turn)
            engine.forget([("conversation", i) for i in running if TURNS[i] == turn + 1])
    return out


def _reusable(i: int, turns: list) -> int:
    """The tokens conversation ``i``'s later turns could reuse: each turn's prompt and
    completion, for every turn that has a next one."""
    prompt, total = len(FIRST[i]), 0
    for turn, c in enumerate(turns[:-1]):
        total += prompt + len(c.token_ids)
        prompt += len(c.token_ids) + len(_reply(i, turn))
    return total


def _assert_same(kept: list[list], full: list[list]) -> None:
    assert [[c.token_ids for c in turns] for turns in kept] == [
        [c.token_ids for c in turns] for turns in full
    ]
    for a, b in zip(kept, full, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x.finish_reason == y.finish_reason
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("adapters")
    policy = load_policy(resolve_model(MODEL), lora=LoraSettings())
    folders = []
    for seed in (1, 2):
        randomise_lora_b(policy, seed)
        save_adapter(policy, root / f"a{seed}")
        folders.append(str(root / f"a{seed}"))
    return folders


@pytest.mark.parametrize("kernels", ["1", "0"], ids=["kernels", "torch-ops"])
@pytest.mark.parametrize("decode", ["static", "static-cdf"])
def test_kept_cache_samples_what_a_full_prefill_samples(adapters, decode, kernels, monkeypatch):
    monkeypatch.setenv("ENTROGYM_DECODE_KERNEL", kernels)
    with _engine(decode, keep_cache=False) as engine:
        full = _converse(engine, (adapters[0],))
        assert engine.kept_cache_stats["conversations"] == 0
    with _engine(decode) as engine:
        kept = _converse(engine, (adapters[0],))
        stats = engine.kept_cache_stats
        assert stats["conversations"] == 0  # each forgotten as it ended
    _assert_same(kept, full)
    # every turn after the first reused its conversation's cache: the previous prompt and
    # the completion's tokens, all but (at most) a last one that was never fed back
    assert stats["hits"] == sum(TURNS) - len(TURNS) and stats["misses"] == len(TURNS)
    upper = sum(_reusable(i, turns) for i, turns in enumerate(kept))
    assert upper - stats["hits"] <= stats["reused_tokens"] <= upper
    assert len({tuple(turns[0].token_ids) for turns in kept}) > 1  # a real sample


def test_a_new_adapter_version_never_reuses_a_kept_cache(adapters):
    """Turns alternate between two versions: no turn reuses the other version's cache, and
    the samples are a full prefill's."""
    with _engine("static", keep_cache=False, max_loras=2) as engine:
        full = _converse(engine, adapters)
    with _engine("static", max_loras=2) as engine:
        kept = _converse(engine, adapters)
        assert engine.kept_cache_stats["hits"] == 0
    _assert_same(kept, full)


def test_dropping_a_version_drops_its_kept_caches(adapters):
    with _engine("static", max_loras=1) as engine:
        keys = [("conversation", i) for i in range(2)]
        engine.generate(FIRST[:2], SamplingParams(max_tokens=3), adapters[0], cache_keys=keys)
        assert engine.kept_cache_stats["conversations"] == 2
        engine.generate(FIRST[2:3], SamplingParams(max_tokens=3), adapters[1])
        assert engine.kept_cache_stats["conversations"] == 0  # adapters[0]'s decoder is gone
        engine.generate(FIRST[:2], SamplingParams(max_tokens=3), adapters[1], cache_keys=keys)
        engine.release_caches()
        assert engine.kept_cache_stats["conversations"] == 0


def test_a_prompt_that_departs_from_the_kept_ids_reuses_only_their_common_prefix():
    """A conversation whose ids changed (a re-rendered history) reuses what still matches."""
    params = SamplingParams(max_tokens=4)
    edited = FIRST[1][:-1] + [99, 98, 97]
    with _engine("static-cdf", keep_cache=False) as engine, engine.seeded(0):
        engine.generate([FIRST[1]], params, cache_keys=["c"])
        full = engine.generate([edited], params, cache_keys=["c"])
    with _engine("static-cdf") as engine, engine.seeded(0):
        engine.generate([FIRST[1]], params, cache_keys=["c"])
        kept = engine.generate([edited], params, cache_keys=["c"])
        assert engine.kept_cache_stats["reused_tokens"] == len(FIRST[1]) - 1
    _assert_same([kept], [full])


def test_kept_caches_stay_within_their_budget():
    with _engine("static", kept_cache_bytes=1) as engine:
        engine.generate(FIRST, SamplingParams(max_tokens=3), cache_keys=list(range(len(FIRST))))
        assert engine.kept_cache_stats["conversations"] == 0
        assert engine.kept_cache_stats["bytes"] == 0


def test_cache_keys_are_checked():
    with _engine("static") as engine:
        with pytest.raises(ValueError, match="distinct"):
            engine.generate(FIRST[:2], SamplingParams(max_tokens=2), cache_keys=["a", "a"])
        with pytest.raises(ValueError, match="2 prompts but 1 cache_keys"):
            engine.generate(FIRST[:2], SamplingParams(max_tokens=2), cache_keys=["a"])


def test_common_prefix_and_the_store():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([1, 2], [1, 2]) == 2
    with pytest.raises(ValueError, match="spans"):
        Kept([1, 2], [], 0, [(0, 1)], owner=0)
    store = KeptCaches(limit_bytes=1 << 20)
    store.put("a", Kept([1], [], 0, [(0, 1)], owner=7))
    assert store.get("a", owner=7) is not None and store.get("a", owner=8) is None
    store.keep_owners({8})
    assert store.get("a", owner=7) is None


@pytest.mark.parametrize("chunk_tokens", [None, 2], ids=["turns", "chunks"])
def test_rollouts_with_the_kept_cache_are_those_of_a_full_prefill(chunk_tokens):
    """Episodes of 1 to 6 turns (Steps), sampled with and without the kept cache: the same
    episodes, token for token."""
    agent = LLMAgent.from_model(MODEL, max_turn_tokens=5, max_context=256, on_turn_budget="step")
    episodes = {}
    for keep in (False, True):
        with _engine("static-cdf", keep_cache=keep) as engine:
            episodes[keep] = collect_rollouts(
                Steps, ["t0", "t1"], engine, agent, k=4, early_stop=False, seed=3,
                chunk_tokens=chunk_tokens,
            )  # fmt: skip
            assert engine.kept_cache_stats["conversations"] == 0  # forgotten at the end
            hits = engine.kept_cache_stats["hits"]
        assert hits > 0 if keep else hits == 0
    full, kept = episodes[False], episodes[True]
    assert sorted(e.num_turns for e in kept) == sorted(e.num_turns for e in full)
    assert max(e.num_turns for e in kept) > 1
    for a, b in zip(kept, full, strict=True):
        assert a.token_ids == b.token_ids and a.action_mask == b.action_mask
        assert a.sampler_logprobs == pytest.approx(b.sampler_logprobs, abs=1e-5)
