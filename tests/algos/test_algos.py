"""The algorithm core pinned against independent computations (paper Sec. 2, 5, appendix)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from entrogym.agents.episode import Episode
from entrogym.algos.advantages import grpo, rloo, zero_advantage_groups
from entrogym.algos.entropy import (
    entropy_bonus_loss,
    exact_entropy,
    repo_d,
    repo_r,
    sampled_entropy,
    token_entropy_from_logits,
)
from entrogym.algos.entropy_control import EntropyControl
from entrogym.algos.losses import clipped_policy_loss, sequence_importance_ratio
from entrogym.algos.presets import ALGORITHMS, build_algorithm, get_algorithm
from entrogym.algos.update_batch import minibatch_indices
from entrogym.train.batch import collate_episodes

# ---------------------------------------------------------------- advantages


def test_rloo_both_expressions_of_the_paper_agree():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=g, dtype=torch.float64)
    groups = torch.tensor([i // 6 for i in range(18)] + [3] * 4 + [4] * 2)  # ragged groups
    adv = rloo(rewards, groups)
    for i in range(len(rewards)):
        others = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i] and j != i]
        leave_one_out = rewards[i] - sum(others) / len(others)
        assert adv[i].item() == pytest.approx(float(leave_one_out), abs=1e-12)


def test_grpo_matches_bessel_std_and_zero_on_constant_groups():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.2, 0.9])
    groups = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 2, 2])
    adv = grpo(rewards, groups)
    for g in (0, 2):
        r = rewards[groups == g].numpy().astype(np.float64)
        expected = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        np.testing.assert_allclose(adv[groups == g].numpy(), expected, rtol=1e-5)
    assert torch.equal(adv[groups == 1], torch.zeros(3))
    assert zero_advantage_groups(adv, groups) == 1


@pytest.mark.parametrize("fn", [rloo, grpo])
def test_advantages_reject_bad_input(fn):
    with pytest.raises(ValueError, match="rewards"):
        fn(torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="group_ids"):
        fn(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="at least 2"):
        fn(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]))


# ---------------------------------------------------------------- clipped loss


def _grad_of_loss(logp, old, adv, mask, **kw):
    logp = logp.clone().requires_grad_(True)
    loss, metrics = clipped_policy_loss(logp, old, adv, mask, **kw)
    loss.backward()
    return logp.grad, metrics


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("log_ratio", [-0.5, -0.1, 0.05, 0.4])
def test_gradient_is_zero_exactly_where_clipped(sign, log_ratio):
    eps_low, eps_high = 0.2, 0.28
    old = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    logp = old + torch.tensor([[log_ratio, 0.0]], dtype=torch.float64)
    adv = torch.tensor([sign], dtype=torch.float64)
    mask = torch.ones_like(old)
    grad, _ = _grad_of_loss(logp, old, adv, mask, eps_low=eps_low, eps_high=eps_high)
    unclipped, _ = _grad_of_loss(logp, old, adv, mask)
    r = math.exp(log_ratio)
    clipped = (sign > 0 and r > 1 + eps_high) or (sign < 0 and r < 1 - eps_low)
    if clipped:
        assert grad[0, 0].item() == 0.0
    else:
        assert grad[0, 0].item() == pytest.approx(unclipped[0, 0].item(), abs=1e-15)
        # d/dlogp of -(A * exp(logp - old)) / |tau| with |tau| = 2
        assert grad[0, 0].item() == pytest.approx(-sign * r / 2, rel=1e-12)
    # The unclipped token (ratio 1) always gets the plain policy gradient.
    assert grad[0, 1].item() == pytest.approx(-sign / 2, rel=1e-12)


def test_clip_fractions_respect_the_sign_of_the_advantage():
    old = torch.zeros(4, 3)
    logp = torch.log(
        torch.tensor([[1.5, 1.0, 1.0], [0.5, 1.0, 1.0], [1.5, 1.0, 1.0], [0.5, 1.0, 1.0]])
    )
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    mask = torch.ones(4, 3)
    _, m = clipped_policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    # Only (A>0, r=1.5) clips high and only (A<0, r=0.5) clips low: one token of 12 each.
    assert m["clip_frac_high"] == pytest.approx(1 / 12)
    assert m["clip_frac_low"] == pytest.approx(1 / 12)
    assert m["ratio_max"] == pytest.approx(1.5)
    r = torch.exp(logp)
    assert m["approx_kl"] == pytest.approx(float(((r - 1) - logp).mean()), rel=1e-6)
    assert m["ratio_mean"] == pytest.approx(float(r.mean()), rel=1e-6)


def test_aggregations_follow_their_definitions():
    old = torch.zeros(2, 3)
    logp = torch.zeros(2, 3)  # ratio 1 everywhere: objective per token = A
    adv = torch.tensor([1.0, 4.0])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    seq, _ = clipped_policy_loss(logp, old, adv, mask, aggregation="sequence-mean")
    tok, _ = clipped_policy_loss(logp, old, adv, mask, aggregation="token-mean")
    assert seq.item() == pytest.approx(-(1.0 + 4.0) / 2)
    assert tok.item() == pytest.approx(-(1.0 + 3 * 4.0) / 4)


def test_gspo_ratio_is_geometric_mean_and_clip_counts_trajectories():
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(3, 5, generator=g, dtype=torch.float64)
    logp = old + 0.01 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]], dtype=torch.float64)
    s = sequence_importance_ratio(logp, old, mask)
    for i in range(3):
        ratios = [math.exp(logp[i, t] - old[i, t]) for t in range(5) if mask[i, t]]
        geo = math.prod(ratios) ** (1 / len(ratios))
        assert s[i].item() == pytest.approx(geo, rel=1e-12)
    adv = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    loss, m = clipped_policy_loss(
        logp, old, adv, mask, eps_low=3e-4, eps_high=4e-4, level="sequence"
    )
    expected_high = sum(1 for i in range(3) if adv[i] > 0 and s[i] > 1 + 4e-4) / 3
    expected_low = sum(1 for i in range(3) if adv[i] < 0 and s[i] < 1 - 3e-4) / 3
    assert m["clip_frac_high"] == pytest.approx(expected_high)
    assert m["clip_frac_low"] == pytest.approx(expected_low)
    # The loss value equals GSPO's -mean_i min(A s_i, A clip(s_i)).
    clipped = torch.minimum(adv * s, adv * s.clamp(1 - 3e-4, 1 + 4e-4))
    assert loss.item() == pytest.approx(-clipped.mean().item(), rel=1e-12)


def test_gspo_gradient_equals_sequence_objective_gradient():
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(2, 4, generator=g, dtype=torch.float64)
    logp = (old + 0.001 * torch.randn(2, 4, generator=g, dtype=torch.float64)).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([0.7, -1.3], dtype=torch.float64)
    loss, _ = clipped_policy_loss(logp, old, adv, mask, level="sequence")  # no clip
    (grad,) = torch.autograd.grad(loss, logp)
    logp2 = logp.detach().clone().requires_grad_(True)
    s = sequence_importance_ratio(logp2, old, mask)
    (ref,) = torch.autograd.grad(-(adv * s).mean(), logp2)
    torch.testing.assert_close(grad, ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("aggregation", ["sequence-mean", "token-mean"])
def test_loss_passes_gradcheck_in_float64(level, aggregation):
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    # Keep ratios away from the clip boundaries, where the objective has kinks.
    logp = (old + torch.tensor([[0.5, -0.05, 0.02, -0.6]] * 3, dtype=torch.float64)).requires_grad_(
        True
    )
    adv = torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.float64)
    kw = dict(eps_low=0.2, eps_high=0.28, level=level, aggregation=aggregation)
    if level == "sequence":
        # GSPO's objective is a function of one advantage per trajectory; per-token advantages
        # use the stop-gradient surrogate, whose gradient is by design not that of its value.
        adv = adv[:, 0]
        kw.update(eps_low=0.05, eps_high=0.05)

    def f(x):
        return clipped_policy_loss(x, old, adv, mask, **kw)[0]

    assert torch.autograd.gradcheck(f, (logp,), eps=1e-6, atol=1e-8)


def test_loss_rejects_bad_input():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="old_logprobs"):
        clipped_policy_loss(x, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="advantages"):
        clipped_policy_loss(x, x, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="no action tokens"):
        clipped_policy_loss(x, x, torch.zeros(2), torch.tensor([[1.0, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="advantages contains NaN"):
        clipped_policy_loss(x, x, torch.tensor([float("nan"), 0.0]), torch.ones(2, 3))
    with pytest.raises(ValueError, match="eps_low"):
        clipped_policy_loss(x, x, torch.zeros(2), torch.ones(2, 3), eps_low=-0.1)
    with pytest.raises(ValueError, match="level"):
        clipped_policy_loss(x, x, torch.zeros(2), torch.ones(2, 3), level="episode")


# ---------------------------------------------------------------- REPO and controllers


def _repo_r_listing(adv: float, logp: float, zeta: float) -> float:
    """The paper's listing, literally, one token at a time."""
    if adv > 0:
        adv = adv * (1 - zeta * logp)
        adv = max(adv, 0.0)
    elif adv < 0:
        adv = adv * (1 + zeta * logp)
        adv = min(adv, 0.0)
    return adv


@pytest.mark.parametrize("zeta", [0.05, 1e-3, -0.05, 3.0, -3.0])
def test_repo_r_matches_the_listing_including_clamps(zeta):
    rng = random.Random(0)
    adv = torch.tensor(
        [[rng.choice([-1.5, -0.2, 0.0, 0.3, 2.0]) for _ in range(7)] for _ in range(5)]
    )
    logp = torch.tensor([[-rng.expovariate(0.5) for _ in range(7)] for _ in range(5)])
    out = repo_r(adv, logp, zeta)
    for i in range(5):
        for t in range(7):
            expected = _repo_r_listing(adv[i, t].item(), logp[i, t].item(), zeta)
            assert out[i, t].item() == pytest.approx(expected, rel=1e-6, abs=1e-7)
    if abs(zeta) == 3.0:  # large |zeta| makes some factors negative: the clamps must bite
        assert ((adv > 0) & (out == 0)).any() or ((adv < 0) & (out == 0)).any()


def test_repo_r_broadcasts_sequence_advantages_and_detaches_logprobs():
    logp = torch.tensor([[-0.1, -3.0], [-0.1, -3.0]], requires_grad=True)
    out = repo_r(torch.tensor([1.0, -1.0]), logp, 0.05)
    assert not out.requires_grad
    # Rare correct token is boosted more; rare wrong token is penalised less.
    assert out[0, 1] > out[0, 0] > 1.0
    assert -1.0 < out[1, 0] < out[1, 1] < 0.0


def test_repo_d_is_advantage_minus_zeta_logp():
    adv = torch.tensor([0.5, -0.5])
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -4.0]])
    torch.testing.assert_close(repo_d(adv, logp, 0.1), adv[:, None] - 0.1 * logp)


# ---------------------------------------------------------------- entropy estimates


def test_sampled_entropy_is_unbiased_for_the_exact_entropy():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, generator=g) * 2
    logp = torch.log_softmax(logits, -1)
    samples = torch.multinomial(logp.exp(), 200_000, replacement=True, generator=g)
    est = sampled_entropy(logp[samples][None, :], torch.ones(1, samples.numel()))
    exact = exact_entropy(logits[None, None, :], torch.ones(1, 1)).item()
    assert est == pytest.approx(exact, abs=0.01)


def test_exact_entropy_and_bonus():
    uniform = torch.zeros(2, 3, 8)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert exact_entropy(uniform, mask).item() == pytest.approx(math.log(8), rel=1e-6)
    logits = torch.randn(2, 3, 8, requires_grad=True)
    bonus = entropy_bonus_loss(token_entropy_from_logits(logits), mask, beta=0.1)
    bonus.backward()
    assert bonus.item() == pytest.approx(
        -0.1 * exact_entropy(logits.detach(), mask).item(), rel=1e-6
    )
    assert logits.grad[0, 2].abs().sum() == 0  # unmasked positions get no gradient
    with pytest.raises(ValueError, match="no action tokens"):
        sampled_entropy(torch.zeros(1, 2), torch.zeros(1, 2))


# ---------------------------------------------------------------- presets


def test_presets_have_the_papers_defaults():
    assert set(ALGORITHMS) == {
        "rloo", "grpo", "loop", "dapo", "gspo", "repo-r", "repo-d", "adapo",
        "grpo-entropy-bonus", "grpo-adaptive-entropy", "clip-cov", "kl-cov",
    }  # fmt: skip

    def clip(name: str) -> tuple:
        p = ALGORITHMS[name].loss.params
        return p.eps_low, p.eps_high, p.ratio_level, p.aggregation

    rloo_ = ALGORITHMS["rloo"]
    assert (rloo_.epochs, rloo_.minibatch_size, *clip("rloo")[:2]) == (1, None, None, None)
    assert ALGORITHMS["grpo"].advantage.name == "grpo" and ALGORITHMS["grpo"].epochs == 2
    assert ALGORITHMS["loop"].advantage.name == "rloo" and clip("loop")[1] == 0.2
    assert clip("dapo")[:2] == (0.2, 0.28)
    assert clip("gspo")[:3] == (3e-4, 4e-4, "sequence")
    for name in ("repo-r", "repo-d", "grpo-entropy-bonus"):
        assert ALGORITHMS[name].controller.name == "paper"
        assert ALGORITHMS[name].controller.params.factor == 2.0
    # REPO's zeta ranges (appendix "Training") are the levers' coefficients
    assert EntropyControl(ALGORITHMS["repo-r"]).controller.bounds() == (-0.05, 0.05)
    assert EntropyControl(ALGORITHMS["repo-r"]).controller._min() == 1e-4
    assert EntropyControl(ALGORITHMS["repo-d"]).controller.bounds() == (-10.0, 10.0)
    assert EntropyControl(ALGORITHMS["repo-d"]).controller._min() == 1e-3
    adapo = EntropyControl(ALGORITHMS["adapo"])
    assert (adapo.coefficient, adapo.controller.bounds()) == (0.28, (0.2, 0.32))
    assert ALGORITHMS["grpo-entropy-bonus"].lever.name == "entropy-bonus"
    # verl's Clip-Cov / KL-Cov modes and defaults
    assert clip("clip-cov") == (0.2, 0.2, "token", "token-mean")
    assert clip("kl-cov")[:2] == (None, None) and clip("kl-cov")[3] == "token-mean"
    assert EntropyControl(ALGORITHMS["clip-cov"]).coefficient == 2e-4
    assert ALGORITHMS["clip-cov"].lever.params.lb == 1.0
    assert ALGORITHMS["clip-cov"].lever.params.ub == 5.0
    assert EntropyControl(ALGORITHMS["kl-cov"]).coefficient == 1.0
    assert ALGORITHMS["kl-cov"].lever.params.kl_cov_ratio == 2e-4


def test_unknown_preset_and_knob_names_are_clear_errors():
    with pytest.raises(ValueError, match="presets: rloo, grpo"):
        get_algorithm("ppo")
    with pytest.raises(ValueError, match="algo.epoch is not a setting of an algorithm"):
        build_algorithm({"name": "grpo", "epoch": 3})
    assert build_algorithm({"name": "grpo", "minibatch_size": 256}).minibatch_size == 256


# ---------------------------------------------------------------- buffer


def _episode(i: int, n: int, group: int) -> Episode:
    mask = [0] * (n // 2) + [1] * (n - n // 2)
    return Episode(
        task_id=f"t{group}",
        group_id=group,
        token_ids=list(range(100 + i, 100 + i + n)),
        action_mask=mask,
        sampler_logprobs=[-0.1 * (k + 1) * m for k, m in enumerate(mask)],
        reward=float(i % 2),
    )


def test_episode_buffer_round_trips_ragged_episodes():
    episodes = [_episode(i, n, g) for i, (n, g) in enumerate([(3, 7), (9, 7), (1, 42), (5, 42)])]
    batch = collate_episodes(episodes, pad_token_id=0)
    assert batch.input_ids.shape == (4, 9)
    assert batch.group_ids.tolist() == [0, 0, 1, 1]  # 7 and 42, renumbered in order
    assert batch.rewards.tolist() == [0.0, 1.0, 0.0, 1.0]
    for i, ep in enumerate(episodes):
        row = batch.row(i)
        assert row["token_ids"] == ep.token_ids
        assert row["action_mask"] == ep.action_mask
        assert row["sampler_logprobs"] == pytest.approx(ep.sampler_logprobs)
        assert batch.attention_mask[i].sum() == len(ep.token_ids)
        assert batch.input_ids[i, len(ep.token_ids) :].eq(0).all()
    ids, attention = batch.tokens(torch.tensor([0, 2]))
    assert ids.shape == attention.shape == (2, 3)


def test_episode_and_buffer_reject_bad_input():
    with pytest.raises(ValueError, match="equal lengths"):
        Episode("t", 0, [1, 2], [1], [0.0, 0.0], 1.0)
    with pytest.raises(ValueError, match="empty"):
        collate_episodes([])


def test_minibatch_indices_cover_everything_once():
    g = torch.Generator().manual_seed(0)
    chunks = list(minibatch_indices(10, 4, g))
    assert [len(c) for c in chunks] == [4, 4, 2]
    assert sorted(torch.cat(chunks).tolist()) == list(range(10))
    assert len(list(minibatch_indices(10, None))) == 1
