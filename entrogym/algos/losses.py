"""Clipped policy-gradient objectives: PPO/GRPO/LOOP/DAPO (token ratios) and GSPO (sequence ratio).

Shapes: ``B`` trajectories, ``T`` tokens; ``mask`` is 1 on action tokens (sampled by the policy).

The policy loss is an algorithm's ``loss`` part (registry ``LOSSES``; ``clipped`` with
:class:`ClipParams`). It works in two stages so that levers and token masks can act between
them: :func:`clipped_token_objective` gives the per-token objective, and :func:`aggregate`
reduces it to the scalar loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from entrogym.algos.checks import check_token_inputs
from entrogym.algos.registry import Registry

RatioLevel = Literal["token", "sequence"]
Aggregation = Literal["sequence-mean", "token-mean"]
LEVELS: tuple[str, ...] = get_args(RatioLevel)
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)


@dataclass(frozen=True)
class ClipParams:
    """Knobs of the ``clipped`` policy loss.

    Args:
        eps_low: lower clip: ratios below 1 - eps_low are clipped (None = unclipped; in [0, 1)).
        eps_high: upper clip: ratios above 1 + eps_high are clipped (None = unclipped; >= 0).
        ratio_level: ``token`` (PPO-style, one ratio per token) or ``sequence`` (GSPO's geometric
            mean ratio per trajectory).
        aggregation: ``sequence-mean`` (the paper's 1/|tau| form) or ``token-mean`` (DAPO's).
    """

    eps_low: float | None = 0.2
    eps_high: float | None = 0.2
    ratio_level: RatioLevel = "token"
    aggregation: Aggregation = "sequence-mean"

    def __post_init__(self) -> None:
        if self.eps_low is not None and not 0 <= self.eps_low < 1:
            raise ValueError(
                f"algo.loss.eps_low must be in [0, 1) (the ratio's lower bound 1 - eps_low must stay "
                f"positive) or None, got {self.eps_low}"
            )
        if self.eps_high is not None and not self.eps_high >= 0:
            raise ValueError(f"algo.loss.eps_high must be >= 0 or None, got {self.eps_high}")
        if self.ratio_level not in LEVELS:
            raise ValueError(
                f"algo.loss.ratio_level must be one of {LEVELS}, got {self.ratio_level!r}"
            )
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"algo.loss.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}"
            )


@dataclass
class TokenObjective:
    """The clipped objective per token, before aggregation, and what levers need from it.

    ``objective[B, T]`` is to be maximised (the loss is ``-aggregate(objective)``); ``ratio``
    is the importance ratio each token's term uses (GSPO's sequence ratio broadcast);
    ``clipped`` marks action tokens whose clipped branch is strictly the minimum (their
    gradient is zero: verl's ``clip_by_origin``); ``mask`` is the action mask in the
    objective's dtype and ``advantages`` are broadcast to ``[B, T]``; ``metrics`` are the clip
    statistics.
    """

    objective: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    metrics: dict[str, float]


def token_importance_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """w_t = pi_new(a_t|s_t) / pi_old(a_t|s_t) (Sec. 2, PPO objective), from fp32 log-probs.

    The ratio is formed from log-probs exactly as given: Thm 3 is about what happens when those
    were rounded to bf16 first, so callers must pass fp32 (see ``entrogym.train.learner.logprobs``).
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


def clipped_token_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float | None = None,
    eps_high: float | None = None,
    level: str = "token",
) -> TokenObjective:
    """The clipped surrogate min(A w, A clip(w)) per token, with its diagnostics.

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

    with torch.no_grad():
        r_tok = ratio.detach()
        clipped = (advantages * r_tok.clamp(low, high) < advantages * r_tok) & (mask > 0)
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
    return TokenObjective(objective, ratio, clipped, mask, advantages, metrics)


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
    """Negative clipped surrogate objective (``clipped_token_objective`` aggregated) and its
    diagnostics."""
    terms = clipped_token_objective(
        logprobs, old_logprobs, advantages, mask, eps_low=eps_low, eps_high=eps_high, level=level
    )
    return -aggregate(terms.objective, terms.mask, aggregation), terms.metrics


# A policy loss is fn(logprobs, old_logprobs, advantages, mask, params, eps_low, eps_high) ->
# TokenObjective; the clip range is passed apart from the params because a lever may move it
# (ADAPO's upper clip).
LOSSES: Registry = Registry("loss")
register_loss = LOSSES.register


@register_loss("clipped", params=ClipParams)
def _clipped(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: ClipParams,
    eps_low: float | None,
    eps_high: float | None,
) -> TokenObjective:
    """PPO's clipped surrogate min(A w, A clip(w)), with token or sequence (GSPO) ratios."""
    return clipped_token_objective(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        eps_low=eps_low,
        eps_high=eps_high,
        level=params.ratio_level,
    )
