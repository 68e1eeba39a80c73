"""Rollout collection (lockstep, early stopping, env errors, engine restarts) and the mismatch
metric, with the ``hf`` engine on the tiny random Llama."""

from __future__ import annotations

import math

import pytest
import torch

import entrogym  # noqa: F401  (registers the envs)
from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import EngineDied, SamplingParams, make_engine
from entrogym.agents.engines.hf import HFEngine
from entrogym.agents.rollout import Episode, collect_rollouts, early_stop_reached
from entrogym.envs.base import TextEnv, Turn, make_text_env, task_ids_of
from entrogym.models import resolve_model
from entrogym.train.batch import collate_episodes
from entrogym.train.learner.mismatch import episodes_mismatch, sampler_mismatch
from entrogym.train.learner.policy import load_base_model

MODEL = "tiny-random-llama"


class Steps(TextEnv):
    """Episode ``i`` (reset seed ``i``) lasts ``1 + i % 6`` turns; with ``explode`` the episodes
    of length 4 raise in their second step; task ``broken`` fails to reset."""

    splits = ("train",)

    def __init__(self, explode: bool = False) -> None:
        super().__init__(max_turns=20)
        self.explode, self.length = explode, 1

    def task_ids(self, split=None):
        return ["t0", "t1", "broken"]

    def reset(self, *, seed=None, options=None):
        self.length = 1 + (seed or 0) % 6
        return super().reset(seed=seed, options=options)

    def _start_task(self, task_id):
        if task_id == "broken":
            raise RuntimeError("cannot start")
        return f"Task {task_id}. Say anything.", {}

    def _respond(self, action):
        n = self._turn + 1
        if self.explode and n == 2 and self.length == 4:
            raise RuntimeError("boom")
        done = n >= self.length
        return Turn(f"turn {n} of {self.length}", done=done, reward=float(done), success=done)


def test_early_stop_rule():
    assert not early_stop_reached([4, 4, 4, 4], k=6)  # 4 of 6 everywhere but only 67% overall
    assert early_stop_reached([6, 6, 5, 5], k=6)  # 22 of 24 >= 90% and every task >= 4
    assert not early_stop_reached([6, 6, 6, 3], k=6)  # 21/24 but one task has only 3
    assert early_stop_reached([2, 2], k=2, min_done_per_task=4)  # capped at k
    assert early_stop_reached([4, 4], k=6, min_done_fraction=0.6)


@pytest.mark.parametrize(
    ("per_task", "fraction", "returned", "max_turns"),
    [(4, 0.9, 12, 6), (4, 0.6, 8, 4), (5, 0.6, 10, 5), (6, 0.6, 12, 6)],
)
def test_early_stopping_cancels_the_stragglers(
    engine, agent, per_task, fraction, returned, max_turns
):
    eps = collect_rollouts(
        Steps,
        ["t0", "t1"],
        engine,
        agent,
        k=6,
        min_done_per_task=per_task,
        min_done_fraction=fraction,
    )
    assert len(eps) == returned and eps.stats["cancelled"] == 12 - returned
    assert max(e.num_turns for e in eps) == max_turns
    for e in eps:  # survivors are the short episodes, each finished by the env
        assert e.reward == 1.0 and e.info["success"] and e.num_turns == e.info["turn"]
    assert sorted(sum(e.group_id == g for e in eps) for g in (0, 1)) == [returned // 2] * 2


def test_keep_cancelled_and_no_early_stop(engine, agent):
    eps = collect_rollouts(
        Steps, ["t0", "t1"], engine, agent, k=6, min_done_fraction=0.6, keep_cancelled=True
    )
    assert len(eps) == 12 and sum(bool(e.info.get("cancelled")) for e in eps) == 4
    assert all(e.reward == 0.0 for e in eps if e.info.get("cancelled"))
    eps = collect_rollouts(Steps, ["t0"], engine, agent, k=6, early_stop=False)
    assert len(eps) == 6 and sorted(e.num_turns for e in eps) == [1, 2, 3, 4, 5, 6]


def test_progress_counts_ended_episodes(engine, agent):
    counts: list[int] = []
    eps = collect_rollouts(
        Steps, ["t0", "broken"], engine, agent, k=6, early_stop=False, on_progress=counts.append
    )
    assert counts[0] == 6  # the failed resets have ended before the first step
    assert counts == sorted(counts) and counts[-1] == len(eps) == 12
    assert len(counts) == eps.stats["steps"] + 1  # after the resets, then after every step


def test_env_errors_end_only_their_episode(engine, agent):
    eps = collect_rollouts(
        lambda: Steps(explode=True), ["t0", "broken", "t1"], engine, agent, k=6, early_stop=False
    )
    assert len(eps) == 18 and eps.stats["env_errors"] == 8  # failed episodes come back too
    never_started = [e for e in eps if e.task_id == "broken"]
    assert all(e.failed and e.token_ids == [] and e.reward == 0.0 for e in never_started)
    assert "task 'broken', reset: RuntimeError: cannot start" in never_started[0].error
    failed = [e for e in eps if e.failed and e.task_id != "broken"]
    assert len(failed) == 2 and all("step: RuntimeError: boom" in e.error for e in failed)
    assert all(e.reward == 0.0 and e.num_turns == 2 and not e.info["success"] for e in failed)
    assert all(e.error.startswith("env 'Steps', task ") for e in eps if e.failed)
    assert all(e.reward == 1.0 for e in eps if not e.failed)
    assert {e.group_id for e in eps if not e.failed} == {0, 2}
    assert eps.stats["mean_reward"] == 1.0  # over the episodes that did not fail


def test_arithmetic_rollouts_feed_the_trainer(engine):
    env = make_text_env("entrogym/Arithmetic-v0")
    tasks = task_ids_of(env, "train")[:2]
    env.close()
    agent = LLMAgent.from_model(MODEL, max_turn_tokens=8, max_context=256)
    eps = collect_rollouts(
        "entrogym/Arithmetic-v0", tasks, engine, agent, k=3, chunk_tokens=5, seed=7
    )
    assert len(eps) == 6 and all(isinstance(e, Episode) for e in eps)
    assert [e.task_id for e in eps] == [tasks[0]] * 3 + [tasks[1]] * 3
    assert eps.stats["generated_tokens"] == sum(e.num_action_tokens for e in eps)
    assert eps.stats["generate_calls"] == 2  # 8 tokens in chunks of 5
    for e in eps:  # the random model never answers: cut at the budget, truncated
        assert e.num_action_tokens == 8 and e.truncated and e.reward == 0.0
        assert e.info["truncated_by"] == "turn" and e.info["timing"]["generate_s"] > 0
        assert e.env_id == "entrogym/Arithmetic-v0"
    batch = collate_episodes(eps, 0)
    assert int(batch.mask.sum()) == 48
    model = load_base_model(MODEL, dtype="fp32")
    m = episodes_mismatch(model, eps, batch_size=4)
    assert m["num_tokens"] == 48 and m["max_abs_diff"] < 1e-4


def test_setup_errors(engine, agent):
    with pytest.raises(ValueError, match="k "):
        collect_rollouts(Steps, ["t0"], engine, agent, k=0)
    with pytest.raises(ValueError, match="task_ids"):
        collect_rollouts(Steps, [], engine, agent)
    wide = LLMAgent(agent.tokenizer, max_context=4096)
    with pytest.raises(ValueError, match="max_model_len=1024"):
        collect_rollouts(Steps, ["t0"], engine, wide)
    short = LLMAgent(agent.tokenizer, max_context=10)
    with pytest.raises(ValueError, match="max_context=10"):
        collect_rollouts(Steps, ["t0"], engine, short)


class Flaky(HFEngine):
    """Fault injection: ``_generate`` raises EngineDied ``deaths`` times."""

    deaths = 1

    def _generate(self, prompts, params, adapter):
        if self.deaths > 0:
            self.deaths -= 1
            raise EngineDied("worker killed")
        return super()._generate(prompts, params, adapter)


def test_engine_that_dies_is_restarted_once():
    eng = Flaky(resolve_model(MODEL), max_model_len=64)
    out = eng.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    assert eng.restarts == 1 and len(out[0].token_ids) == 2
    eng.deaths = 2
    with pytest.raises(RuntimeError, match="died again after a restart"):
        eng.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    assert eng.restarts == 2
    eng.close()
    with pytest.raises(RuntimeError, match="closed"):
        eng.generate([[1]], SamplingParams(max_tokens=1))


def test_sampler_mismatch_metric():
    trainer = torch.tensor([[0.0, math.log(1.2), math.log(0.95), 5.0]])
    sampler = torch.zeros(1, 4)
    mask = torch.tensor([[1, 1, 1, 0]])
    m = sampler_mismatch(trainer, sampler, mask)
    assert m["num_tokens"] == 3
    assert m["max_abs_diff"] == pytest.approx(math.log(1.2))
    assert m["mean_abs_diff"] == pytest.approx((math.log(1.2) - math.log(0.95)) / 3)
    assert m["frac_ratio_outside"] == pytest.approx(1 / 3)
    assert sampler_mismatch(trainer, sampler, mask, low=0.5, high=1.5)["frac_ratio_outside"] == 0
    with pytest.raises(ValueError, match="one shape"):
        sampler_mismatch(trainer, sampler[:, :3], mask)
    with pytest.raises(ValueError, match="no tokens"):
        sampler_mismatch(trainer, sampler, torch.zeros(1, 4))


def test_bad_engine_options():
    with pytest.raises(ValueError, match="engine kind"):
        make_engine("tgi", MODEL)
    with pytest.raises(ValueError, match="urls"):
        make_engine("hf", MODEL, urls=["http://127.0.0.1:1"])
    with pytest.raises(ValueError, match="dtype"):
        make_engine("hf", MODEL, dtype="int4")
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_hf_engine_applies_and_removes_adapters(engine, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    torch.manual_seed(0)
    lora = get_peft_model(
        load_base_model(MODEL, dtype="fp32"),
        LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "down_proj"],
                   init_lora_weights=False, task_type="CAUSAL_LM"),
    )  # fmt: skip
    lora.save_pretrained(str(tmp_path / "v1"))
    agent = LLMAgent.from_model(MODEL, max_turn_tokens=4, max_context=128)
    base = load_base_model(MODEL, dtype="fp32")
    peft_model = PeftModel.from_pretrained(
        load_base_model(MODEL, dtype="fp32"), str(tmp_path / "v1")
    )

    def rollout(adapter):
        return collect_rollouts(
            Steps, ["t0"], engine, agent, k=2, adapter=adapter, early_stop=False
        )

    with_adapter = rollout(str(tmp_path / "v1"))
    assert episodes_mismatch(peft_model.eval(), with_adapter)["max_abs_diff"] < 1e-4
    assert episodes_mismatch(base.eval(), with_adapter)["mean_abs_diff"] > 1e-2
    without = rollout(None)  # back to the base model after an adapter was loaded
    assert episodes_mismatch(base, without)["max_abs_diff"] < 1e-4


class Scored(Steps):
    """Never ends by itself; its terminal outcome when cut short is a partial score."""

    def _respond(self, action):
        return Turn("x " * 40, done=False)  # long feedback fills a small context fast

    def _on_truncate(self):
        return Turn(done=True, reward=0.25, success=False, info={"scored_at_end": True})


def test_full_context_ends_with_the_envs_own_outcome(engine):
    """AppWorld evaluates the world when the agent's context fills: the episode's reward is
    the env's ``end_episode`` outcome, not a blanket 0."""
    agent = LLMAgent.from_model(MODEL, max_turn_tokens=3, max_context=160, on_turn_budget="step")
    runs = collect_rollouts(Scored, ["t0"], engine, agent, k=2, early_stop=False)
    for e in runs:
        assert e.info["truncated_by"] == "context" and e.info["scored_at_end"], e.info
        assert e.reward == 0.25 and e.info["success"] is False
