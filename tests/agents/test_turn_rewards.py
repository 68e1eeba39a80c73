"""Per-turn rewards in rollouts (``--turn-rewards``): refused by default as the text-env
contract says, recorded one per turn when asked for, their sum the episode's reward and
within ``reward_range``; off, rollouts and batches are what they were."""

from __future__ import annotations

import pytest
import torch

from entrogym.agents.agent import LLMAgent
from entrogym.agents.rollout import collect_rollouts
from entrogym.algos import UpdateBatch
from entrogym.algos.turns import turn_counts
from entrogym.envs.base import TextEnv, Turn
from entrogym.train.batch import collate_episodes

MODEL = "tiny-random-llama"


class Paid(TextEnv):
    """Episode ``i`` (reset seed ``i``) lasts ``1 + i % 4`` turns; every turn pays ``each``
    (``Turn.turn_reward``) and the last one also ``terminal``; cut short, ``end_episode``
    pays 0.25."""

    splits = ("train",)

    def __init__(self, each: float = 0.1, terminal: float = 0.5, feedback: str = "ok") -> None:
        super().__init__(max_turns=20)
        self.each, self.terminal, self.feedback, self.length = each, terminal, feedback, 1

    def task_ids(self, split=None):
        return ["t0", "t1"]

    def reset(self, *, seed=None, options=None):
        self.length = 1 + (seed or 0) % 4
        return super().reset(seed=seed, options=options)

    def _start_task(self, task_id):
        return f"Task {task_id}. Say anything.", {}

    def _respond(self, action):
        done = self._turn + 1 >= self.length
        return Turn(self.feedback, done=done, reward=self.terminal if done else 0.0,
                    success=done, turn_reward=self.each)  # fmt: skip

    def _on_truncate(self):
        return Turn(done=True, reward=0.25, success=False)


def _collect(engine, agent, env=Paid, turn_rewards=True, seed=0):
    with engine.seeded(seed):
        return collect_rollouts(env, ["t0", "t1"], engine, agent, k=4, early_stop=False,
                                turn_rewards=turn_rewards)  # fmt: skip


def test_a_reward_before_the_last_step_is_an_env_error_by_default(engine, agent):
    eps = _collect(engine, agent, turn_rewards=False)
    failed = [e for e in eps if e.failed]
    assert {e.num_turns for e in failed} == {1}  # the first step paid: the episode ends there
    assert len(failed) == 6  # the episodes of 2, 3 and 4 turns
    assert all("before the episode's last step" in e.error for e in failed)
    assert all("--turn-rewards" in e.error for e in failed)
    ok = [e for e in eps if not e.failed]
    assert all(e.reward == pytest.approx(0.6) and "turn_rewards" not in e.info for e in ok)


def test_each_turn_is_paid_and_the_reward_is_the_return(engine, agent):
    eps = _collect(engine, agent)
    assert not any(e.failed for e in eps)
    assert sorted(e.num_turns for e in eps) == [1, 1, 2, 2, 3, 3, 4, 4]
    for e in eps:
        paid = e.info["turn_rewards"]
        assert paid == pytest.approx([0.1] * (e.num_turns - 1) + [0.6])
        assert e.reward == pytest.approx(sum(paid)) == pytest.approx(0.1 * e.num_turns + 0.5)


def test_a_return_outside_the_reward_range_fails_its_episode(engine, agent):
    eps = _collect(engine, agent, env=lambda: Paid(terminal=0.75))
    failed = sorted(e.num_turns for e in eps if e.failed)
    assert failed == [3, 3, 4, 4]  # 0.1 * turns + 0.75 > 1
    assert all("outside the env's reward_range" in e.error for e in eps if e.failed)


def test_a_turn_the_env_never_saw_is_paid_what_ended_it(engine):
    """Cut at the turn budget (truncate): 0. The context full: end_episode's 0.25, for the
    turn the context cut, or added to the last turn's when the feedback did not fit."""
    cut = LLMAgent.from_model(MODEL, max_turn_tokens=3, max_context=1024)  # truncate
    for e in _collect(engine, cut):
        assert e.info["truncated_by"] == "turn" and e.info["turn_rewards"] == [0.0]
        assert e.reward == 0.0 and e.num_turns == 1
    small = LLMAgent.from_model(MODEL, max_turn_tokens=3, max_context=120, on_turn_budget="step")
    eps = _collect(engine, small, env=lambda: Paid(feedback="x " * 30))
    full = [e for e in eps if e.info.get("truncated_by") == "context"]
    assert full
    for e in full:
        paid = e.info["turn_rewards"]
        assert len(paid) == e.num_turns and e.reward == pytest.approx(sum(paid))
        assert paid[-1] == pytest.approx(0.25) or paid[-1] == pytest.approx(0.35)


def test_the_batch_carries_one_reward_per_turn(engine, agent):
    eps = _collect(engine, agent)
    batch = collate_episodes(eps, turn_rewards=True)
    counts = turn_counts(batch.mask)
    assert counts.tolist() == [e.num_turns for e in eps]  # a turn = a run of action tokens
    assert batch.turn_rewards.shape == (len(eps), 4)
    for i, e in enumerate(eps):
        n = e.num_turns
        assert batch.turn_rewards[i, :n].tolist() == pytest.approx(e.info["turn_rewards"])
        assert batch.turn_rewards[i, n:].abs().sum() == 0
    batch.compute_advantages("grpo")
    assert batch.token_advantages.shape == batch.mask.shape
    with pytest.raises(ValueError, match="has no info\\['turn_rewards'\\]"):
        collate_episodes(_collect(engine, agent, env=lambda: Paid(each=0.0), turn_rewards=False),
                         turn_rewards=True)  # fmt: skip


def test_off_rollouts_and_batches_are_what_they_were(engine, agent):
    """An env with terminal rewards samples the same tokens and gets the same rewards either
    way; without the flag the episodes carry no per-turn rewards, and the batch is bit for
    bit the batch of episodes that never had any."""

    def terminal_only():
        return Paid(each=0.0)

    off = _collect(engine, agent, env=terminal_only, turn_rewards=False)
    on = _collect(engine, agent, env=terminal_only, turn_rewards=True)
    assert [e.token_ids for e in off] == [e.token_ids for e in on]
    assert [e.reward for e in off] == [e.reward for e in on]
    assert all("turn_rewards" not in e.info for e in off)
    assert all(e.info["turn_rewards"][:-1] == [0.0] * (e.num_turns - 1) for e in on)
    plain, ignored = collate_episodes(off), collate_episodes(on)  # the flag off: ignored
    for batch in (plain, ignored):
        assert batch.turn_rewards is None
        batch.compute_advantages("grpo")
        assert batch.token_advantages is None
    for name in ("rewards", "group_ids", "mask", "lengths", "input_ids", "attention_mask",
                 "sampler_logprobs", "versions", "advantages"):  # fmt: skip
        a, b = getattr(plain, name), getattr(ignored, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert isinstance(plain, UpdateBatch)
