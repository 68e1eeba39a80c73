"""The field's levers against independent computations: verl's Clip-Cov and KL-Cov loss
functions and TRL's high-entropy mask and adaptive entropy, each written out here from its
published definition, compared with what entrogym's update computes."""

from __future__ import annotations

import pytest
import torch

from entrogym.algos import (
    EntropyControl,
    UpdateBatch,
    build_algorithm,
    high_entropy_tokens,
    policy_update,
    token_covariance,
)
from entrogym.algos.micro_loss import micro_batch_loss
from entrogym.algos.update_batch import Rows

B, T = 6, 5


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 6).requires_grad_()
    old = logprobs.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64) * 3
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[0, 3:] = 0
    mask[4, 1:] = 0
    return logprobs, old, adv, mask


def _ours(algo: dict, logprobs, old, adv, mask, entropies=None, seed=0):
    control = EntropyControl(build_algorithm(algo))
    gen = torch.Generator().manual_seed(seed)
    loss, metrics, _ = micro_batch_loss(control, Rows(adv, old, mask), logprobs, entropies, gen)
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss.detach(), grad, metrics


def _masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


# ---------------------------------------------------------------- the token covariance


def test_token_covariance_is_the_centred_product_over_action_tokens():
    logprobs, _, adv, mask = _batch()
    logprobs = logprobs.detach()
    cov = token_covariance(adv, logprobs, mask)
    tokens = [(i, t) for i in range(B) for t in range(T) if mask[i, t] > 0]
    mean_a = sum(float(adv[i]) for i, _ in tokens) / len(tokens)
    mean_lp = sum(float(logprobs[i, t]) for i, t in tokens) / len(tokens)
    for i in range(B):
        for t in range(T):
            want = (float(adv[i]) - mean_a) * (float(logprobs[i, t]) - mean_lp) if mask[i, t] else 0
            assert float(cov[i, t]) == pytest.approx(want, abs=1e-12)


# ---------------------------------------------------------------- verl's Clip-Cov


def verl_clip_cov(old, logp, adv, mask, *, clip_ratio, lb, ub, low, high, pick):
    """verl compute_policy_loss_clip_cov (token-mean), step by step. ``pick(candidates, n)``
    chooses n of the candidate (row, col) pairs, as verl's randperm does."""
    adv = adv[:, None].expand_as(logp)
    ratio = torch.exp(logp - old)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - low, 1 + high)
    clip_by_origin = (pg2 > pg1) & (mask > 0)
    cov = (adv - _masked_mean(adv, mask)) * (logp - _masked_mean(logp.detach(), mask))
    cov = cov.detach().clone()
    cov[mask == 0] = -torch.inf
    cov[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_ratio * mask.sum().item()), 1)
    candidates = torch.nonzero((cov < ub) & (cov > lb) & (mask > 0))
    chosen = pick(candidates, min(clip_num, len(candidates)))
    corr = torch.ones_like(adv)
    corr[chosen[:, 0], chosen[:, 1]] = 0
    losses = torch.maximum(pg1, pg2) * corr
    return (losses * mask).sum() / mask.sum(), candidates, chosen


@pytest.mark.parametrize("clip_ratio", [0.5, 2e-4])
def test_clip_cov_equals_verl(clip_ratio):
    logprobs, old, adv, mask = _batch(1)
    algo = {"name": "clip-cov", "lever": {"lb": 0.2, "ub": 4.0},
            "controller": {"init": clip_ratio}}  # fmt: skip

    def same_draw(candidates, n):  # the draw entrogym makes with the update's seeded stream
        order = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(0))
        return candidates[order[:n]]

    want, candidates, chosen = verl_clip_cov(
        old, logprobs, adv, mask, clip_ratio=clip_ratio, lb=0.2, ub=4.0, low=0.2, high=0.2,
        pick=same_draw,
    )  # fmt: skip
    (want_grad,) = torch.autograd.grad(want, logprobs)
    loss, grad, metrics = _ours(algo, logprobs, old, adv, mask)
    assert len(chosen) == min(max(int(clip_ratio * float(mask.sum())), 1), len(candidates))
    assert len(chosen) >= 1 and (clip_ratio > 0.1 or len(candidates) > len(chosen))
    torch.testing.assert_close(loss, want.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)
    for i, t in chosen.tolist():
        assert grad[i, t] == 0  # their gradient is detached
    assert metrics["clip_cov_share"] == pytest.approx(len(chosen) / float(mask.sum()))


def test_clip_cov_with_coefficient_zero_is_the_clipped_loss():
    logprobs, old, adv, mask = _batch(1)
    off, grad_off, metrics = _ours(
        {"name": "clip-cov", "controller": {"init": 0.0}}, logprobs, old, adv, mask
    )
    plain, grad_plain, _ = _ours(
        {"name": "grpo", "loss": {"aggregation": "token-mean"}}, logprobs, old, adv, mask
    )
    torch.testing.assert_close(off, plain)
    torch.testing.assert_close(grad_off, grad_plain)
    assert metrics["clip_cov_share"] == 0.0


# ---------------------------------------------------------------- verl's KL-Cov


def verl_kl_cov(old, logp, adv, mask, *, kl_cov_ratio, kl_coef):
    """verl compute_policy_loss_kl_cov (token-mean), step by step."""
    adv = adv[:, None].expand_as(logp)
    log_ratio = logp - old
    ratio = torch.exp(log_ratio)
    losses = -adv * ratio
    losses_kl = -adv * ratio + kl_coef * log_ratio.abs()
    valid_idx = torch.nonzero((mask > 0).reshape(-1), as_tuple=True)[0]
    valid_adv = adv[mask > 0].detach().reshape(-1)
    valid_logp = logp[mask > 0].detach().reshape(-1)
    cov = (valid_adv - valid_adv.mean()) * (valid_logp - valid_logp.mean())
    k = max(1, int(len(cov) * kl_cov_ratio))
    top = valid_idx[torch.topk(cov, k, largest=True).indices]
    rows, cols = top // adv.shape[1], top % adv.shape[1]
    losses = losses.clone()
    losses[rows, cols] = losses_kl[rows, cols]
    return (losses * mask).sum() / mask.sum(), torch.stack([rows, cols], 1)


@pytest.mark.parametrize(("ratio", "coef"), [(2e-4, 1.0), (0.3, 0.7)])
def test_kl_cov_equals_verl(ratio, coef):
    logprobs, old, adv, mask = _batch(2)
    want, chosen = verl_kl_cov(old, logprobs, adv, mask, kl_cov_ratio=ratio, kl_coef=coef)
    (want_grad,) = torch.autograd.grad(want, logprobs)
    algo = {"name": "kl-cov", "lever": {"kl_cov_ratio": ratio}, "controller": {"init": coef}}
    loss, grad, metrics = _ours(algo, logprobs, old, adv, mask)
    torch.testing.assert_close(loss, want.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)
    assert metrics["kl_cov_share"] == pytest.approx(len(chosen) / float(mask.sum()))


# ---------------------------------------------------------------- TRL's high-entropy mask


def trl_high_entropy_mask(entropies, mask, threshold):
    """TRL GRPOTrainer.get_high_entropy_mask on one process."""
    local = entropies[mask.bool()].float()
    entropy_threshold = torch.quantile(local, threshold)
    masked_entropies = entropies * mask.float()
    return (masked_entropies >= entropy_threshold) & mask.bool()


@pytest.mark.parametrize("rho", [0.0, 0.2, 0.5, 1.0])
def test_high_entropy_mask_equals_trl_and_scales_the_loss(rho):
    logprobs, old, adv, mask = _batch(3)
    entropies = torch.rand(B, T, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    keep = high_entropy_tokens(entropies, mask, rho)
    assert torch.equal(keep, trl_high_entropy_mask(entropies, mask, 1 - rho))
    loss, grad, metrics = _ours(
        {"name": "grpo", "mask": {"name": "high-entropy", "quantile": rho}},
        logprobs, old, adv, mask, entropies,
    )  # fmt: skip
    # TRL: per-token loss times the mask, still divided by all tokens (here: sequence-mean)
    ratio = torch.exp(logprobs - old)
    a = adv[:, None]
    per_token = -torch.minimum(a * ratio, a * ratio.clamp(0.8, 1.2)) * keep
    want = ((per_token * mask).sum(1) / mask.sum(1)).mean()
    (want_grad,) = torch.autograd.grad(want, logprobs)
    torch.testing.assert_close(loss, want.detach())
    torch.testing.assert_close(grad, want_grad)
    assert metrics["token_mask_share"] == pytest.approx(float(keep.sum() / mask.sum()))
    assert (grad[~keep] == 0).all()


def test_high_entropy_mask_needs_entropies():
    control = EntropyControl(build_algorithm({"name": "repo-r", "mask": "high-entropy"}))
    assert control.needs_entropy  # the scorer is asked for the chunked exact entropies
    logprobs, old, adv, mask = _batch()
    with pytest.raises(ValueError, match="needs score\\(\\) to return entropies"):
        micro_batch_loss(control, Rows(adv, old, mask), logprobs, None)


# ---------------------------------------------------------------- TRL's adaptive entropy


def test_adaptive_entropy_preset_steps_beta_as_trl_each_optimizer_step():
    """grpo-adaptive-entropy on a tabular policy with 4 minibatches: the beta each step applies
    and the entropy it measures follow TRL's rule (the TRLAdaptiveEntropy reference)."""
    from tests.algos.test_controllers import TRLAdaptiveEntropy

    torch.manual_seed(0)
    n_states, n_arms, k = 8, 5, 4
    logits = torch.nn.Parameter(torch.randn(n_states, n_arms) * 3)
    states = torch.arange(n_states).repeat_interleave(k)
    actions = torch.multinomial(torch.softmax(logits.detach(), -1)[states], 1).flatten()
    rewards = (actions % 2 == 0).double()
    optimizer = torch.optim.SGD([logits], lr=5.0)
    config = build_algorithm({"name": "grpo-adaptive-entropy", "epochs": 1, "minibatch_size": 8,
                              "controller": {"target": 1.0, "delta": 0.05}})  # fmt: skip
    control = EntropyControl(config)
    applied, measured = [], []
    extra = control.lever.extra_loss

    def recording_extra(logprobs, entropies, mask, coef, **told):
        applied.append(coef)
        measured.append(float((entropies.detach() * mask).sum() / mask.sum()))
        return extra(logprobs, entropies, mask, coef, **told)

    control.lever.extra_loss = recording_extra

    def score(index, need_entropy):
        logp = torch.log_softmax(logits[states[index]], -1)
        lp = logp.gather(1, actions[index, None])
        ent = -(logp.exp() * logp).sum(-1, keepdim=True)
        return lp, ent if need_entropy else None

    batch = UpdateBatch.build(config.advantage, rewards=rewards, group_ids=states,
                              mask=torch.ones(len(states), 1))  # fmt: skip
    metrics = policy_update(
        control, batch, score=score, backward=torch.Tensor.backward,
        step=lambda: optimizer.step() or True, zero_grad=optimizer.zero_grad,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert len(applied) == 4  # one micro-batch per optimizer step
    trl = TRLAdaptiveEntropy(0.0, 1.0, 0.05, 0.0, 1.0)
    assert applied == [trl.step(h) for h in measured]
    assert applied[0] == 0.0 and metrics["beta"] == trl.coef
    assert metrics["entropy_target"] == 1.0  # absolute, in nats


def test_the_entropy_neutral_zeta_zeroes_the_shaped_covariance():
    """zeta* = Cov(logp, A) / Var(logp) over the action tokens (numpy, independently), and the
    cov-neutral lever's advantages at coefficient 0 have zero covariance with logp."""
    import numpy as np

    from entrogym.algos import build_algorithm
    from entrogym.algos.entropy import centred_repo_d, entropy_neutral_zeta
    from entrogym.algos.entropy_control import EntropyControl

    gen = torch.Generator().manual_seed(3)
    logp = -torch.rand(4, 6, generator=gen, dtype=torch.float64) * 5
    adv = torch.randn(4, generator=gen, dtype=torch.float64)
    mask = torch.ones(4, 6, dtype=torch.float64)
    mask[0, 4:] = 0
    mask[2, 1:] = 0
    on = mask.numpy() > 0
    l_np, a_np = logp.numpy()[on], np.repeat(adv.numpy()[:, None], 6, axis=1)[on]
    expected = np.cov(l_np, a_np, bias=True)[0, 1] / np.var(l_np)
    assert entropy_neutral_zeta(adv, logp, mask) == pytest.approx(expected, rel=1e-12)
    control = EntropyControl(build_algorithm({"name": "grpo", "lever": "cov-neutral"}))
    assert control.controller.name == "pi" and control.coefficient == 0.0
    shaped = control.lever.shape_advantages(adv, logp, None, control.coefficient, mask)
    torch.testing.assert_close(shaped, centred_repo_d(adv, logp, mask, expected))
    assert abs(np.cov(l_np, shaped.numpy()[on], bias=True)[0, 1]) < 1e-12
    # a padded position changes nothing
    assert entropy_neutral_zeta(adv, logp.masked_fill(mask == 0, -99.0), mask) == pytest.approx(
        expected, rel=1e-12
    )
