"""EntroPIC's and AEPO's formulas against independent computations: plain-Python loops for the
per-token reweighting and the PI law, torch.autograd against the analytic REINFORCE gradient on
a tabular softmax, and each rule's direction."""

from __future__ import annotations

import math
import random

import pytest
import torch

from entrogym.algos import CONTROLLERS, LEVERS, Coefficient
from entrogym.algos.aepo import (
    Aepo,
    AepoParams,
    TemperatureSamples,
    aepo_reinforce_loss,
    aepo_temperature_step,
)
from entrogym.algos.entropic import EntropicParams, entropic_adjustment
from entrogym.algos.lever_hooks import LeverInputs
from entrogym.algos.losses import clipped_token_objective

ALPHA = Coefficient("alpha", init=0.0, min=1e-3, max=1.0)
TEMP = Coefficient("temperature", init=1.2, min=0.8, max=1.2, signed=False)


def test_entropic_weights_match_a_loop():
    g = torch.Generator().manual_seed(0)
    logprobs = torch.log(torch.rand(4, 5, generator=g).clamp(0.05, 0.99))
    old = logprobs + 0.1 * torch.randn(4, 5, generator=g)
    adv = torch.randn(4, 5, generator=g)
    mask = (torch.rand(4, 5, generator=g) > 0.2).float()
    ratio = torch.exp(logprobs - old)
    alpha, tau = 0.4, 0.5
    got = entropic_adjustment(ratio, adv, logprobs, mask, alpha, tau)
    for b in range(4):
        for t in range(5):
            likely = mask[b, t] > 0 and math.exp(float(logprobs[b, t])) > tau
            a, r = float(adv[b, t]), float(ratio[b, t])
            # weight 1 - alpha on a positive advantage, 1 + alpha on a negative one
            weight = (1 - alpha if a > 0 else 1 + alpha) if likely else 1.0
            want = weight * r * a - r * a
            assert float(got[b, t]) == pytest.approx(want, abs=1e-6)


def test_entropic_lever_reweights_the_clipped_objective():
    lever = LEVERS.get("entropic")(EntropicParams(high_prob=0.0))
    logprobs = torch.log(torch.tensor([[0.6, 0.3]]))
    adv = torch.tensor([[1.0, -2.0]])
    mask = torch.ones(1, 2)
    terms = clipped_token_objective(logprobs, logprobs, adv, mask, eps_low=0.2, eps_high=0.2)
    objective, metrics = lever.adjust_objective(terms, LeverInputs(logprobs, logprobs, None), 0.5)
    # ratio 1: A(1 - 0.5) for the positive token, A(1 + 0.5) for the negative one
    assert objective[0].tolist() == pytest.approx([0.5, -3.0])
    assert metrics["entropic_share"] == 1.0


def _pi_law(entropies, target, kp, ki, bound):
    """The official dp_actor.py update, written out: alpha_paper = kp e + ki I with e = H - H*,
    clipped, I summed after; entrogym's alpha is its negation."""
    out, acc = [], 0.0
    for h in entropies:
        paper = max(-bound, min(bound, kp * (h - target) + ki * acc))
        acc += h - target
        out.append(-paper)
    return out


def test_entropic_controller_is_the_papers_pi_law():
    rng = random.Random(1)
    entropies = [1.0 + rng.uniform(-0.8, 0.8) for _ in range(40)]
    params = CONTROLLERS.params("entropic", {"kp": 1.0, "ki": 0.3})
    c = CONTROLLERS.get("entropic")(params, ALPHA, 0.0)
    got = []
    for h in entropies:
        c.update(h, 1.0)
        got.append(c.applied())
    assert got == pytest.approx(_pi_law(entropies, 1.0, 1.0, 0.3, 1.0))
    assert c.applied() > 0 or entropies[-1] >= 1.0  # sanity: sign follows the error
    c2 = CONTROLLERS.get("entropic")(params, ALPHA, 0.0)
    c2.load_state_dict(c.state_dict())
    c.update(0.2, 1.0)
    c2.update(0.2, 1.0)
    assert c2.applied() == c.applied()


def test_entropic_controller_raises_alpha_below_target_and_lowers_it_above():
    params = CONTROLLERS.params("entropic", {})
    c = CONTROLLERS.get("entropic")(params, ALPHA, 0.0)
    c.update(0.5, 1.0)
    assert c.applied() > 0  # below target: likely positive tokens weigh less
    c = CONTROLLERS.get("entropic")(params, ALPHA, 0.0)
    c.update(1.5, 1.0)
    assert c.applied() < 0


def test_aepo_loss_gradient_is_the_reinforce_estimate_on_a_tabular_softmax():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    states = torch.tensor([0, 0, 1, 2, 2, 2])
    actions = torch.tensor([1, 4, 0, 5, 5, 2])
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.0])
    logp = torch.log_softmax(logits[states], -1).gather(1, actions[:, None])
    aepo_reinforce_loss(logp, rewards, torch.ones(6, 1), alpha=0.7).backward()
    # analytic: d(-alpha/n sum R_i log pi(a_i|s_i))/dz_s = -alpha/n sum_i R_i (e_{a_i} - pi_s)
    probs = torch.softmax(logits.detach(), -1)
    want = torch.zeros(3, 6, dtype=torch.float64)
    for s, a, r in zip(states.tolist(), actions.tolist(), rewards.tolist(), strict=True):
        onehot = torch.zeros(6, dtype=torch.float64)
        onehot[a] = 1.0
        want[s] -= 0.7 / 6 * r * (onehot - probs[s])
    assert torch.allclose(logits.grad, want)


def test_aepo_temperature_rule_and_controller():
    assert aepo_temperature_step(0.5, 1.0, 0.8, 1.2) == 1.2
    assert aepo_temperature_step(1.0, 1.0, 0.8, 1.2) == 0.8
    assert aepo_temperature_step(1.5, 1.0, 0.8, 1.2) == 0.8
    c = CONTROLLERS.get("aepo")(CONTROLLERS.params("aepo", {"max": 2.0}), TEMP, TEMP.init)
    c.update(0.3, 1.0)
    assert c.applied() == 2.0
    c.update(1.3, 1.0)
    assert c.applied() == 0.8
    with pytest.raises(ValueError, match="min"):
        CONTROLLERS.get("aepo")(CONTROLLERS.params("aepo", {"min": 0.0}), TEMP, TEMP.init)


def test_aepo_lever_needs_samples_and_adds_the_term():
    lever = Aepo(AepoParams(alpha=2.0))
    mask = torch.ones(2, 1)
    with pytest.raises(ValueError, match="temperature"):
        lever.extra_loss(torch.zeros(2, 1), None, mask, 1.2)
    logp = torch.log(torch.tensor([[0.5], [0.25]]))
    lever.attach(TemperatureSamples(torch.tensor([1.0, 1.0]), mask, lambda: logp))
    got = lever.extra_loss(torch.zeros(2, 1), None, mask, 1.2)
    assert float(got) == pytest.approx(-2.0 * (math.log(0.5) + math.log(0.25)) / 2)
