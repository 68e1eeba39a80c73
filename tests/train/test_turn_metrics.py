"""Per-turn metrics of a multi-turn run, through ``entrogym train`` as a user types it, against
the env's own record of its episodes; the entropy by turn against an independent forward pass
of the tiny model; what ended an episode, read from its fields."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from vowel_env import TINY_SETTINGS, option_words  # registers test/VowelTurns-v0

from entrogym.agents.episode import Episode
from entrogym.cli import main
from entrogym.models import resolve_model
from entrogym.train.config import TrainConfig
from entrogym.train.folder.metrics import read_metrics, summary_line
from entrogym.train.folder.turn_metrics import (
    END_REASONS,
    end_reason,
    episode_turn_metrics,
    turns_text,
)
from entrogym.train.trainer import Trainer

ENV = "vowel_env:test/VowelTurns-v0"
SETTINGS = {**TINY_SETTINGS, "iterations": 1, "tasks_per_iter": 3, "samples": 3,
            "early_stop_min_per_task": 3, "early_stop_fraction": 1.0}  # fmt: skip


def _expected(records: list[dict]) -> dict:
    """The per-turn fields counted from the env's log of its episodes."""
    turns = [r["turns"] for r in records]
    by_turns: dict[int, list[float]] = {}
    for r in records:
        by_turns.setdefault(r["turns"], []).append(r["return"])
    ends = Counter(r["end"] for r in records)
    return {
        "turns_mean": sum(turns) / len(turns),
        "turns_max": max(turns),
        "turns_hist": {str(n): turns.count(n) for n in sorted(set(turns))},
        "end_reasons": {reason: ends.get(reason, 0) for reason in END_REASONS},
        "tool_calls": sum(r["tool_calls"] for r in records),
        "tool_errors": sum(r["tool_errors"] for r in records),
        "reward_by_turns": {str(n): sum(v) / len(v) for n, v in sorted(by_turns.items())},
    }


@pytest.mark.parametrize("turn_rewards", [False, True])
def test_a_multi_turn_run_records_its_turns(tmp_path: Path, capsys, turn_rewards: bool) -> None:
    log = tmp_path / "episodes.jsonl"
    kwargs = json.dumps({"log": str(log), "pay_turns": turn_rewards, "max_turns": 3})
    argv = ["train", "--env", ENV, "--env-kwargs", kwargs, *option_words(SETTINGS),
            "--eval-env", ENV, "--eval-env-kwargs", kwargs, "--eval-every", "1",
            "--eval-samples", "2", "--turn-rewards", str(turn_rewards).lower(),
            "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    train_records = [r for r in records if r["task_id"].startswith("train-")]
    eval_records = [r for r in records if r["task_id"].startswith("test-")]
    assert len(train_records) == 9 and len(eval_records) == 3 * 2
    rows = read_metrics(tmp_path / "run")
    train_row = next(r for r in rows if r["kind"] == "train")
    eval_row = next(r for r in rows if r["kind"] == "eval")
    for row, mine in ((train_row, train_records), (eval_row, eval_records)):
        want = _expected(mine)
        for key, value in want.items():
            assert row[key] == pytest.approx(value), (row["kind"], key)
    assert train_row["reward_mean"] == pytest.approx(
        sum(r["return"] for r in train_records) / len(train_records)
    )
    assert len({r["turns"] for r in train_records}) > 1  # the run saw episodes of several lengths
    by_turn = train_row["entropy_by_turn"]
    assert list(by_turn) == [str(j) for j in range(1, train_row["turns_max"] + 1)]
    assert all(v > 0 for v in by_turn.values())
    assert list(eval_row["sampler_entropy_by_turn"]) == [
        str(j) for j in range(1, eval_row["turns_max"] + 1)
    ]
    printed = capsys.readouterr().out
    assert f"turns={train_row['turns_mean']:.2f} ended=" in printed
    assert summary_line(train_row) in printed
    assert main(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "turns.png").read_bytes()[:4] == b"\x89PNG"


def test_entropy_by_turn_is_each_turns_mean_surprisal_under_the_policy(tmp_path: Path) -> None:
    """Iteration 0's old log-probs are the base model's (LoRA starts at zero): an independent
    forward pass of the model over the batch's ids gives each turn's mean -log p."""
    from transformers import AutoModelForCausalLM

    cfg = TrainConfig(env="test/VowelTurns-v0", out=str(tmp_path / "run"), **SETTINGS)
    trainer = Trainer(cfg)
    try:
        trainer.sampler.publish_adapter(0)
        batch, stats = trainer.sampler.collect(0)
        model = AutoModelForCausalLM.from_pretrained(resolve_model(cfg.model)).float().eval()
        with torch.no_grad():
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
        token_logp = logp.gather(2, batch.input_ids[:, 1:, None]).squeeze(2)
        sums: dict[int, list[float]] = {}
        for i in range(len(batch)):
            turn, inside = 0, False
            for t in range(1, int(batch.lengths[i])):
                if batch.mask[i, t] > 0:
                    turn += not inside
                    sums.setdefault(turn, []).append(-float(token_logp[i, t - 1]))
                inside = bool(batch.mask[i, t] > 0)
        row = trainer.iteration(0, (batch, stats))
    finally:
        trainer.close()
    want = {str(j): sum(v) / len(v) for j, v in sorted(sums.items())}
    assert len(want) > 1
    assert row["entropy_by_turn"] == pytest.approx(want, rel=1e-4, abs=1e-5)
    tokens = {j: len(v) for j, v in sums.items()}  # weighted by tokens: the batch's estimate
    pooled = sum(row["entropy_by_turn"][str(j)] * n for j, n in tokens.items()) / sum(
        tokens.values()
    )
    assert pooled == pytest.approx(row["entropy_sampler"], rel=1e-5)


def _episode(**fields) -> Episode:
    base = dict(task_id="t", group_id=0, token_ids=[1, 2], action_mask=[0, 1],
                sampler_logprobs=[0.0, -1.0], reward=0.5, num_turns=2)  # fmt: skip
    return Episode(**{**base, **fields})


def test_what_ended_an_episode_is_read_from_its_fields() -> None:
    cases = [
        (_episode(), "done"),
        (_episode(info={"end_reason": "turn_budget"}), "turn_budget"),  # the agent's word wins
        (_episode(error="env 'x', task 't', step: boom"), "error"),
        (_episode(info={"cancelled": True}), "cancelled"),
        (_episode(truncated=True, info={"truncated_by": "context"}), "context"),
        (_episode(truncated=True, info={"truncated_by": "turn"}), "turn_budget"),
        (_episode(truncated=True, info={"truncated_by": "env"}), "max_turns"),
        (_episode(truncated=True, info={"finish_reasons": ["stop", "turn"]}), "turn_budget"),
    ]
    for episode, reason in cases:
        assert end_reason(episode) == reason, episode.info
    episodes = [e for e, _ in cases]
    for e in episodes:
        e.info.setdefault("tool_calls", 2)
    episodes[0].info["tool_errors"] = 1
    metrics = episode_turn_metrics(episodes, cancelled=3)
    assert metrics["end_reasons"] == {"done": 1, "max_turns": 1, "turn_budget": 3,
                                      "context": 1, "error": 1, "cancelled": 1 + 3}  # fmt: skip
    assert (metrics["tool_calls"], metrics["tool_errors"]) == (16, 1)
    assert metrics["turns_hist"] == {"2": 8} and metrics["turns_mean"] == 2.0
    assert metrics["reward_by_turns"] == {"2": 0.5}  # the failed episode's reward left out
    assert episode_turn_metrics([])["turns_mean"] is None


def test_the_console_shows_turns_only_for_multi_turn_or_tool_episodes() -> None:
    single = episode_turn_metrics([_episode(num_turns=1)] * 3)
    assert turns_text(single) == ""
    multi = episode_turn_metrics(
        [_episode(), _episode(truncated=True, info={"truncated_by": "env"})]
    )
    assert turns_text(multi) == " turns=2.00 ended=done:1,max_turns:1"
    tools = episode_turn_metrics([_episode(num_turns=1, info={"tool_calls": 3, "tool_errors": 1})])
    assert turns_text(tools) == " turns=1.00 ended=done:1 tool_errors=1/3"


class _Caller:
    """An engine that answers every turn with one tool call, ``find_contact(name="Zed")``: a
    contact the env does not know, so every call fails."""

    max_model_len = 2048

    def __init__(self, agent) -> None:
        text = 'find_contact(name="Zed")'
        self.ids = [*agent.tokenizer(text, add_special_tokens=False)["input_ids"], agent.eot_ids[0]]

    def generate(self, prompts, params, adapter=None):
        from entrogym.agents.engines.base import Completion

        return [Completion(list(self.ids), [-1.0] * len(self.ids), "stop") for _ in prompts]


def test_a_tool_envs_calls_and_errors_reach_the_metrics() -> None:
    """Through a ToolEnv (``tests/tool_envs.py``): each step's counts, summed by the agent into
    the episode's ``info``, are what the metrics add up; its ``end_reason`` is what they count."""
    from tool_envs import PhoneEnv

    from entrogym.agents.agent import LLMAgent
    from entrogym.agents.rollout import collect_rollouts

    agent = LLMAgent.from_model("tiny-random-llama", max_context=2048)
    eps = collect_rollouts(lambda: PhoneEnv(max_turns=3), ["ann", "bob"], _Caller(agent), agent,
                           k=2, early_stop=False)  # fmt: skip
    metrics = episode_turn_metrics(eps)
    assert all(e.info["tool_calls"] == e.info["tool_errors"] == 3 for e in eps)
    assert (metrics["tool_calls"], metrics["tool_errors"]) == (12, 12)
    assert metrics["tool_calls"] == eps.stats["tool_calls"]  # the collection's own count
    assert metrics["end_reasons"]["max_turns"] == 4 and metrics["turns_hist"] == {"3": 4}
    assert turns_text(metrics) == " turns=3.00 ended=max_turns:4 tool_errors=12/12"


def test_a_tool_env_may_pay_each_turn() -> None:
    """A ToolEnv subclass pays per turn by setting ``turn_reward`` on its answer: here -0.1
    for each failed call, within a reward_range that takes the negative return."""
    from tool_envs import PhoneEnv

    from entrogym.agents.agent import LLMAgent
    from entrogym.agents.rollout import collect_rollouts

    class Penalised(PhoneEnv):
        reward_range = (-1.0, 1.0)

        def _respond(self, action):
            turn = super()._respond(action)
            turn.turn_reward = -0.1 * turn.info["tool_errors"]
            return turn

    agent = LLMAgent.from_model("tiny-random-llama", max_context=2048)
    eps = collect_rollouts(lambda: Penalised(max_turns=3), ["bob"], _Caller(agent), agent, k=2,
                           early_stop=False, turn_rewards=True)  # fmt: skip
    for e in eps:
        assert e.info["turn_rewards"] == pytest.approx([-0.1, -0.1, -0.1])
        assert e.reward == pytest.approx(-0.3) and e.info["end_reason"] == "max_turns"
