"""policy_update owns gradient clearing, and may score old log-probs itself (on-policy reuse)."""

from __future__ import annotations

import pytest
import torch

from entrogym.algos import EntropyControl, UpdateBatch, build_algorithm, policy_update
from entrogym.experiments.lab import _scorer
from entrogym.theory.tabular import TabularSoftmaxPolicy


def _problem(seed: int = 0, states: int = 3, k: int = 4):
    """A tabular softmax policy, K sampled arms per state and random rewards."""
    g = torch.Generator().manual_seed(seed)
    policy = TabularSoftmaxPolicy(torch.randn(states, 5, generator=g))
    state_ids = torch.arange(states).repeat_interleave(k)
    actions = policy.sample(state_ids, g)
    rewards = torch.rand(len(state_ids), generator=g)
    return policy, state_ids, actions, rewards


def _run(cfg, problem, *, nan_at=(), old=True, step=None, micro=2, seed=1):
    """One update; score call number ``nan_at`` (1-based) returns NaN log-probs. Returns the
    gradient seen by each step, the metrics and the batch."""
    policy, states, actions, rewards = problem
    base, calls, grads = _scorer(policy, states, actions), [], []

    def score(index, need):
        calls.append(len(index))
        lp, ent = base(index, need)
        return (lp * float("nan") if len(calls) in nan_at else lp), ent

    def record():
        grads.append(policy.logits.grad.clone())
        return True

    with torch.no_grad():
        old_lp = policy.action_logprobs(states, actions) if old else None
    batch = UpdateBatch.build(
        cfg.advantage,
        rewards=rewards,
        group_ids=states,
        mask=torch.ones(len(states), 1),
        old_logprobs=old_lp,
    )
    metrics = policy_update(
        EntropyControl(cfg),
        batch,
        score=score,
        backward=torch.Tensor.backward,
        step=step or record,
        zero_grad=policy.zero_grad,
        micro_batch_size=micro,
        generator=torch.Generator().manual_seed(seed),
    )
    return grads, metrics, batch


def test_a_skipped_minibatch_leaves_no_gradient_for_the_next_step():
    """NaN only in the second micro-batch of the first minibatch: the first micro-batch has
    already back-propagated, and that gradient must not reach the next minibatch's step."""
    cfg = build_algorithm({"name": "loop", "minibatch_size": 4, "epochs": 1})
    clean, clean_m, _ = _run(cfg, _problem())  # steps record gradients, weights stay put
    dirty, dirty_m, _ = _run(cfg, _problem(), nan_at=(2,))
    assert (clean_m["optimizer_steps"], dirty_m["skipped_steps"]) == (3, 1)
    assert len(dirty) == 2
    torch.testing.assert_close(dirty[0], clean[1], rtol=0, atol=0)
    torch.testing.assert_close(dirty[1], clean[2], rtol=0, atol=0)


def test_a_skipped_last_minibatch_leaves_nothing_after_the_update():
    cfg = build_algorithm({"name": "loop", "minibatch_size": 4, "epochs": 1})
    problem = _problem()
    _, metrics, _ = _run(cfg, problem, nan_at=(6,))  # 12 rows, micro 2: call 6 = last chunk
    assert metrics["skipped_steps"] == 1
    assert problem[0].logits.grad is None


def _sgd_step(policy, lr=0.5):
    opt = torch.optim.SGD(policy.parameters(), lr=lr)

    def step():
        opt.step()
        return True

    return step


@pytest.mark.parametrize("preset", ["loop", "repo-r", "grpo-entropy-bonus", "gspo", "rloo"])
def test_reusing_on_policy_scores_equals_scoring_old_logprobs_first(preset):
    cfg = build_algorithm(preset)
    if cfg.minibatch_size is not None:
        cfg = build_algorithm({"name": preset, "minibatch_size": 4})
    runs = {}
    for old in (True, False):
        problem = _problem(seed=3)
        grads, metrics, batch = _run(cfg, problem, old=old, step=None, micro=3)
        runs[old] = (grads, metrics, batch.old_logprobs, problem[0].logits.detach().clone())
    (g2, m2, old2, _), (g1, m1, old1, _) = runs[True], runs[False]
    torch.testing.assert_close(old1, old2, rtol=0, atol=1e-7)
    assert len(g1) == len(g2) == cfg.epochs * (1 if cfg.minibatch_size is None else 3)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert m1.keys() == m2.keys()
    # entropy_exact with old log-probs supplied: only for a controller that tracks it (one
    # no-grad pass); the reusing path has it wherever the loss or the controller needs entropies
    if EntropyControl(cfg).tracks_exact:
        assert m2["entropy_exact"] == pytest.approx(m1["entropy_exact"], rel=1e-6)
        assert m2["entropy_tracked"] == m2["entropy_exact"]
    else:
        assert m2["entropy_exact"] is None
    for key in set(m1) - {"entropy_exact"}:
        expected = m2[key] if m2[key] is None else pytest.approx(m2[key], rel=1e-6, abs=1e-7)
        assert m1[key] == expected, key


def test_reuse_with_real_steps_matches_the_two_pass_path():
    """With an optimizer that moves the weights, later minibatches are off-policy: their old
    log-probs must still be the pre-update ones, scored before the first step."""
    cfg = build_algorithm({"name": "loop", "minibatch_size": 4})
    finals, olds = [], []
    for old in (True, False):
        problem = _problem(seed=4)
        _, metrics, batch = _run(cfg, problem, old=old, step=_sgd_step(problem[0]), micro=None)
        finals.append(problem[0].logits.detach().clone())
        olds.append(batch.old_logprobs)
        assert metrics["optimizer_steps"] == 6
    torch.testing.assert_close(olds[0], olds[1], rtol=0, atol=1e-7)
    torch.testing.assert_close(finals[0], finals[1], rtol=1e-6, atol=1e-6)
