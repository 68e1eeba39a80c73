"""On-policy reuse of the first minibatch's scores as old log-probs, on a real (tiny) LLM.

The update may take the old log-probs of the first minibatch of the first epoch from the
detached scores of its gradient pass and score only the other rows beforehand; in fp32 this
must give the gradients and metrics of scoring every row first.
"""

from __future__ import annotations

import pytest
import torch
from lora_policy import randomise_lora_b

from entrogym.agents.episode import Episode
from entrogym.algos import EntropyControl, UpdateBatch, build_algorithm, policy_update
from entrogym.algos.update import score_old_logprobs
from entrogym.train.batch import collate_episodes
from entrogym.train.learner.logprobs import sequence_logprobs, sequence_logprobs_and_entropy
from entrogym.train.learner.policy import apply_lora, load_base_model, trainable_parameters


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return randomise_lora_b(apply_lora(load_base_model("tiny-random-llama"), seed=0), seed=1)


def _batch() -> UpdateBatch:
    gen = torch.Generator().manual_seed(0)
    episodes = []
    for i in range(8):
        n_prompt, n_action = 3 + i % 3, 2 + (5 * i) % 7
        tokens = torch.randint(0, 1000, (n_prompt + n_action,), generator=gen).tolist()
        mask = [0] * n_prompt + [1] * n_action
        reward = float(torch.rand(1, generator=gen))
        episodes.append(Episode(f"t{i // 4}", i // 4, tokens, mask, [0.0] * len(mask), reward))
    return collate_episodes(episodes, pad_token_id=0)


def _update(model, batch: UpdateBatch, preset: str, *, reuse: bool, lr: float):
    cfg = build_algorithm({"name": preset, "minibatch_size": 4})
    params = list(trainable_parameters(model))
    start = [p.detach().clone() for p in params]
    grads: list[list[torch.Tensor]] = []
    optimizer = torch.optim.SGD(params, lr=lr)

    def score(index, need):
        ids, attention = batch.tokens(index)
        if need:
            return sequence_logprobs_and_entropy(model, ids, attention)
        return sequence_logprobs(model, ids, attention), None

    def step():
        grads.append([p.grad.clone() for p in params])
        optimizer.step()
        return True

    experience = UpdateBatch.build(
        cfg.advantage,
        rewards=batch.rewards,
        group_ids=batch.group_ids,
        mask=batch.mask,
        lengths=batch.lengths,
    )
    if not reuse:  # the two-pass path: every row scored before the update
        score_old_logprobs(experience, torch.arange(len(experience)), score, 2)
    metrics = policy_update(
        EntropyControl(cfg),
        experience,
        score=score,
        backward=torch.Tensor.backward,
        step=step,
        zero_grad=lambda: optimizer.zero_grad(set_to_none=True),
        micro_batch_size=2,
        generator=torch.Generator().manual_seed(7),
    )
    final = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, s in zip(params, start, strict=True):
            p.copy_(s)
    return grads, metrics, experience.old_logprobs, final


# lr 0: every step's gradient comparable; lr 0.5: later rows' old log-probs must predate step 1.
@pytest.mark.parametrize(("preset", "lr"), [("repo-r", 0.0), ("grpo-entropy-bonus", 0.5)])
def test_reused_scores_give_the_two_pass_gradients_and_metrics(model, preset, lr):
    batch = _batch()
    g2, m2, old2, w2 = _update(model, batch, preset, reuse=False, lr=lr)
    g1, m1, old1, w1 = _update(model, batch, preset, reuse=True, lr=lr)
    torch.testing.assert_close(old1, old2, rtol=0, atol=1e-6)
    assert bool((old1[batch.mask.bool()] < 0).all())  # real log-probs everywhere
    assert len(g1) == len(g2) == 4  # 2 epochs x 2 minibatches
    for step1, step2 in zip(g1, g2, strict=True):
        for a, b in zip(step1, step2, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    for a, b in zip(w1, w2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert m1.keys() == m2.keys()
    # both presets' controllers track the exact entropy (the default estimator): both paths
    # score it before the first step (its value: tests/algos/test_entropy_constraint)
    assert m1["entropy_tracked"] == m1["entropy_exact"] is not None
    for key, value in m2.items():
        expected = value if value is None else pytest.approx(value, rel=1e-5, abs=1e-7)
        assert m1[key] == expected, key
