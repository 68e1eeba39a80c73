"""Clipped policy-gradient objectives: PPO/GRPO/LOOP/DAPO (token ratios) and GSPO (sequence ratio).

Shapes: ``B`` trajectories, ``T`` tokens; ``mask`` is 1 on action tokens (sampled by the policy).
"""

from __future__ import annotations

import torch

from entrogym.algos.checks import check_token_inputs

LEVELS = ("token", "sequence")
AGGREGATIONS = ("sequence-mean", "token-mean")


def token_importance_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """w_t = pi_new(a_t|s_t) / pi_old(a_t|s_t) (Sec. 2, PPO objective), from fp32 log-probs.

    The ratio is formed from log-probs exactly as given: Thm 3 is about what happens when those
    were rounded to bf16 first, so callers must pass fp32 (see ``entrogym.train.logprobs``).
    """
    return torch.exp(logprobs - old_logprobs)


def sequence_importance_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """GSPO ratio (Sec. 2, "GSPO"): (pi_new(tau)/pi_old(tau))^(1/|tau|), one value per trajectory.

    Computed as exp(mean over the trajectory's action tokens of (logprobs - old_logprobs)),
    i.e. the geometric mean of the token ratios.
    """
    log_ratio = ((logprobs - old_logprobs) * mask).sum(dim=1) / mask.sum(dim=1)
    return torch.exp(log_ratio)


def clip_bounds(eps_low: float | None, eps_high: float | None) -> tuple[float, float]:
    """[1 - eps_low, 1 + eps_high]; ``None`` leaves that side unclipped."""
    for name, eps in (("eps_low", eps_low), ("eps_high", eps_high)):
        if eps is not None and not eps >= 0:
            raise ValueError(f"{name} must be >= 0 or None (no clip on that side), got {eps}")
    low = -float("inf") if eps_low is None else 1.0 - eps_low
    high = float("inf") if eps_high is None else 1.0 + eps_high
    return low, high


def clipped_objective(ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float):
    """min(A * w, A * clip(w, low, high)) elementwise (Sec. 2, PPO objective).

    Where the clipped branch is the minimum, the term is constant in w and its gradient is 0.
    """
    return torch.minimum(advantages * ratio, advantages * ratio.clamp(low, high))


def aggregate(values: torch.Tensor, mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    """Reduce per-token values to a scalar.

    ``"sequence-mean"``: the paper's 1/|tau| form, a mean over each trajectory's action tokens
    then over trajectories. ``"token-mean"``: DAPO's token-level mean over all action tokens.
    """
    if aggregation == "sequence-mean":
        return ((values * mask).sum(dim=1) / mask.sum(dim=1)).mean()
    if aggregation == "token-mean":
        return (values * mask).sum() / mask.sum()
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float | None = None,
    eps_high: float | None = None,
    level: str = "token",
    aggregation: str = "sequence-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative clipped surrogate objective and its diagnostics.

    ``level="token"`` is PPO/GRPO/LOOP/DAPO (one ratio per token). ``level="sequence"`` is GSPO:
    every token of trajectory i carries the value of the sequence ratio s_i, with the gradient
    routed through its own log-prob (s_i.detach() * exp(logp_t - logp_t.detach())). With
    ``aggregation="sequence-mean"`` this is exactly GSPO's objective min(A s_i, A clip(s_i))
    and its gradient (A s_i / |tau|) sum_t grad logp_t, while still accepting per-token
    advantages (REPO on top of GSPO).

    Metrics: ``clip_frac_low`` (share of action tokens, or trajectories at sequence level, with
    A < 0 and w < 1 - eps_low), ``clip_frac_high`` (A > 0 and w > 1 + eps_high), ``ratio_mean``,
    ``ratio_max``, ``approx_kl`` (k3 estimator of KL(old || new): E[(w - 1) - log w]).
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    logprobs, old_logprobs, advantages, mask = check_token_inputs(
        logprobs, old_logprobs, advantages, mask
    )
    low, high = clip_bounds(eps_low, eps_high)
    log_ratio_tok = logprobs - old_logprobs

    if level == "token":
        ratio = token_importance_ratio(logprobs, old_logprobs)
        # Clip statistics count what one ratio covers: a token here, a trajectory for GSPO.
        stat_ratio, stat_adv, stat_mask = ratio, advantages, mask
    else:
        seq_ratio = sequence_importance_ratio(logprobs, old_logprobs, mask)
        ratio = seq_ratio.detach()[:, None] * torch.exp(logprobs - logprobs.detach())
        # Clip statistics count trajectories: the mean advantage stands for the sequence.
        stat_ratio = seq_ratio
        stat_adv = (advantages * mask).sum(dim=1) / mask.sum(dim=1)
        stat_mask = torch.ones_like(seq_ratio)

    objective = clipped_objective(ratio, advantages, low, high)
    loss = -aggregate(objective, mask, aggregation)

    with torch.no_grad():
        n_counted = stat_mask.sum()
        r = stat_ratio.detach()
        clipped_low = (stat_adv < 0) & (r < low) & (stat_mask > 0)
        clipped_high = (stat_adv > 0) & (r > high) & (stat_mask > 0)
        k3 = (torch.exp(log_ratio_tok) - 1) - log_ratio_tok
        metrics = {
            "clip_frac_low": float(clipped_low.sum() / n_counted),
            "clip_frac_high": float(clipped_high.sum() / n_counted),
            "ratio_mean": float((r * stat_mask).sum() / n_counted),
            "ratio_max": float(r.masked_fill(stat_mask == 0, -float("inf")).max()),
            "approx_kl": float((k3.detach() * mask).sum() / mask.sum()),
        }
    return loss, metrics
