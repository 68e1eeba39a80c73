"""``controller.estimator relative`` in the trainer: the learner's ratio on a tiny LoRA model
against entropies computed from the policy's and a separately loaded base model's full logits,
and ``entrogym train`` tracking it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from entrogym.algos import UpdateBatch
from entrogym.commands.train import cli
from entrogym.models import resolve_model
from entrogym.train.config import TrainConfig
from entrogym.train.devices.distributed import Ranks
from entrogym.train.learner.update import Learner
from entrogym.train.phases import PhaseClock
from tests.lora_policy import randomise_lora_b


def _token_entropies(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """[B, T] exact entropy of the next-token distribution that predicts token t (0 at t = 0),
    from the model's full fp32 logits."""
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits.double()
    logp = torch.log_softmax(logits, -1)
    ent = -(logp.exp() * logp).sum(-1)
    return torch.cat([torch.zeros(len(ids), 1, dtype=ent.dtype), ent[:, :-1]], dim=1)


def test_the_learners_ratio_is_the_policys_entropy_over_the_base_models_on_the_action_tokens():
    from transformers import AutoModelForCausalLM

    learner = Learner(
        TrainConfig(model="tiny-random-llama", env="entrogym/Arithmetic-v0", dtype="fp32"),
        Ranks(), PhaseClock(),
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (3, 9), generator=g)
    attn = torch.ones_like(ids)
    attn[2, 7:] = 0  # a shorter row, padded
    mask = torch.zeros(3, 9)
    mask[:, 4:] = 1.0  # the response: tokens 4 on
    mask[2, 7:] = 0.0
    batch = UpdateBatch.build(None, rewards=torch.zeros(3), group_ids=torch.zeros(3).long(),
                              mask=mask, input_ids=ids, attention_mask=attn,
                              lengths=attn.sum(1))  # fmt: skip
    # a fresh adapter (every LoRA B zero) is the base model: the ratio is 1 exactly
    assert learner.relative_entropy(batch)[0] == pytest.approx(1.0, abs=1e-6)
    randomise_lora_b(learner.policy, seed=4)
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-random-llama")).float()
    # a tiny random model's next-token distributions sit at log(vocab), where no adapter moves
    # them: a sharper head (the same in both models) lets the adapter's change show
    with torch.no_grad():
        for model in (learner.policy, base):
            model.get_output_embeddings().weight.mul_(3.0)
    policy_ent = _token_entropies(learner.policy, ids, attn)
    base_ent = _token_entropies(base, ids, attn)
    expected = float((policy_ent * mask).sum() / (base_ent * mask).sum())
    got, base_nats = learner.relative_entropy(batch)
    assert got == pytest.approx(expected, rel=1e-5)
    assert base_nats == pytest.approx(float((base_ent * mask).sum() / mask.sum()), rel=1e-5)
    assert abs(got - 1.0) > 1e-3  # the adapter moved it
    # the adapter is switched on again afterwards: the policy scores as before
    assert torch.allclose(_token_entropies(learner.policy, ids, attn), policy_ent, atol=1e-6)


RUN = [
    "--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32",
    "--env", "entrogym/Arithmetic-v0", "--env-kwargs", "{num_train: 16, num_test: 4}",
    "--iterations", "3", "--tasks-per-iter", "2", "--samples", "3",
    "--early-stop-min-per-task", "3", "--max-response-tokens", "6", "--lr", "0.05",
    "--algo", "grpo", "--algo.lever", "entropy-constraint", "--algo.controller.min", "0",
    "--algo.controller.estimator", "relative", "--algo.controller.target", "0.5",
    "--algo.controller.step", "iteration",
]  # fmt: skip


def test_train_tracks_the_ratio_from_one_at_the_first_iteration(tmp_path: Path) -> None:
    assert cli([*RUN, "--out", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("kind") == "train"]
    assert len(rows) == 3
    assert rows[0]["entropy_tracked"] == pytest.approx(1.0, abs=1e-5)  # a fresh adapter
    assert all(r["entropy_target"] == pytest.approx(0.5, abs=1e-5) for r in rows)
    # the updates moved it (a tiny random model's entropy sits near log(vocab): by little)
    assert abs(rows[-1]["entropy_tracked"] - 1.0) > 1e-6
    # the batch's own exact entropy in nats (the constraint's loss computes it) is still
    # reported beside the ratio
    assert all(r["entropy_exact"] > 0 for r in rows)
