"""Importance weights that correct for the sampler/learner mismatch.

The engine that samples the rollouts (vLLM, or any other) and the model that learns from them
compute slightly different probabilities for the same tokens, even with the same weights, so
"on-policy" samples are in fact off-policy. Truncated importance sampling (Yao et al., 2025,
"Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
https://fengyao.notion.site/off-policy-rl) reweights each sample by the learner/sampler
probability ratio, bounded so that no sample dominates; masked importance sampling (IcePop)
drops the samples whose ratio falls outside the bounds instead.

:func:`sampler_weights` gives the per-token weights of the four modes TRL defines for its
``GRPOConfig.vllm_importance_sampling_mode`` (bounds ``vllm_importance_sampling_clip_min`` /
``vllm_importance_sampling_clip_max``, formerly ``vllm_importance_sampling_cap``; TRL docs
"GRPO Trainer", section on the training-inference mismatch, and "Paper index", sections
"Truncated Importance Sampling", "Masked Importance Sampling" and "Sequence-level Importance
Sampling"). :func:`check_correction` checks a mode and its bounds before any model loads.

Shapes: ``B`` trajectories, ``T`` tokens; ``mask`` is 1 on the tokens the sampler sampled.
"""

from __future__ import annotations

import math

import torch

CORRECTION_MODES: tuple[str, ...] = (
    "token_truncate",
    "token_mask",
    "sequence_truncate",
    "sequence_mask",
)


def check_correction(
    mode: str, clip_min: float | None = None, clip_max: float | None = 3.0
) -> None:
    """A ValueError (one line, saying what to pass) for an unknown ``mode`` or bad bounds.

    ``clip_max`` (C_max, None = no upper bound) must be > 0; ``clip_min`` (C_min, None = no
    lower bound) must be >= 0 and, as TRL requires, below ``clip_max``."""
    if mode not in CORRECTION_MODES:
        raise ValueError(
            f"unknown sampler correction mode {mode!r}; use one of {', '.join(CORRECTION_MODES)}"
        )
    for name, value in (("clip_min", clip_min), ("clip_max", clip_max)):
        if value is not None and (isinstance(value, bool) or not math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number or None, got {value!r}")
    if clip_max is not None and clip_max <= 0:
        raise ValueError(
            f"clip_max must be > 0 (the largest importance weight kept), got {clip_max}"
        )
    if clip_min is not None and clip_min < 0:
        raise ValueError(f"clip_min must be >= 0 (importance ratios are positive), got {clip_min}")
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        raise ValueError(
            f"clip_min ({clip_min}) must be less than clip_max ({clip_max}); lower clip_min "
            "or raise clip_max"
        )


def _check_shapes(
    learner_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor
) -> None:
    if not isinstance(learner_logprobs, torch.Tensor) or learner_logprobs.dim() != 2:
        shape = getattr(learner_logprobs, "shape", learner_logprobs)
        raise ValueError(f"learner_logprobs must be a [B, T] tensor, got {shape}")
    for name, t in (("sampler_logprobs", sampler_logprobs), ("mask", mask)):
        if not isinstance(t, torch.Tensor) or t.shape != learner_logprobs.shape:
            raise ValueError(
                f"{name} shape {tuple(getattr(t, 'shape', ()))} must equal learner_logprobs "
                f"shape {tuple(learner_logprobs.shape)}"
            )


def _bounded(
    ratio: torch.Tensor, mode: str, clip_min: float | None, clip_max: float | None
) -> torch.Tensor:
    """Truncation clips the ratio to [C_min, C_max]; masking zeroes a ratio outside it (TRL:
    ``rho <- clip(rho, C_min, C_max)`` under TIS, ``1[C_min <= rho <= C_max] * rho`` under MIS)."""
    if mode.endswith("_truncate"):
        if clip_min is None and clip_max is None:
            return ratio
        return ratio.clamp(min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return torch.where((ratio >= low) & (ratio <= high), ratio, torch.zeros_like(ratio))


def sampler_weights(
    learner_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """Per-token importance weights [B, T] (float32, 0 where ``mask`` is 0) that correct for the
    sampler/learner mismatch, as TRL's ``vllm_importance_sampling_mode`` defines them.

    With ``log r_t = learner_logprobs - sampler_logprobs`` on each sampled token:

    - ``token_*``: each token's own ratio ``r_t = exp(log r_t)``;
    - ``sequence_*``: one ratio per trajectory, ``exp(sum_t log r_t)`` over its sampled tokens
      (the ratio of the sequence probabilities, pi_learner(y|x) / pi_sampler(y|x): TRL sums the
      per-token log ratios, it does not average them), given to each of its sampled tokens;
    - ``*_truncate``: the ratio clipped to [``clip_min``, ``clip_max``] (TIS; TRL's two-sided
      form: without ``clip_min`` only ``min(r, clip_max)``, the original TIS cap);
    - ``*_mask``: the ratio where ``clip_min <= r <= clip_max``, else 0 (MIS / IcePop); a
      ``sequence_mask`` ratio out of range drops the whole trajectory.

    ``clip_min`` / ``clip_max`` None: no bound on that side (TRL defaults: None and 3.0).

    Both log-prob tensors are taken as constants: the weights carry no gradient, they scale
    the policy-gradient terms. The ratios are computed in float32, so a long sequence's sum of
    bf16 log ratios loses nothing more.

    A sampled token whose sampler log-prob is not finite (NaN, or -inf: the engine reported a
    sample it considered impossible) has no ratio; TRL documents no rule and would pass the
    NaN on. Here it is treated as out of every bound: that token's weight is 0 in ``token_*``
    modes, and its whole trajectory's weights are 0 in ``sequence_*`` modes. A non-finite
    learner log-prob on a sampled token is a ValueError (a bug in the learner, not noise).
    """
    check_correction(mode, clip_min, clip_max)
    _check_shapes(learner_logprobs, sampler_logprobs, mask)
    with torch.no_grad():
        sampled = mask.detach().bool()
        learner = learner_logprobs.detach().float()
        sampler = sampler_logprobs.detach().float()
        if not bool(torch.isfinite(learner[sampled]).all()):
            raise ValueError("learner_logprobs contains NaN or inf on sampled tokens")
        usable = sampled & torch.isfinite(sampler)
        log_ratio = torch.where(usable, learner - sampler, torch.zeros_like(learner))
        if mode.startswith("sequence_"):
            broken = (sampled & ~usable).any(dim=-1, keepdim=True)
            ratio = log_ratio.sum(dim=-1, keepdim=True).exp().expand_as(log_ratio)
            usable = sampled & ~broken
        else:
            ratio = log_ratio.exp()
        weights = _bounded(ratio, mode, clip_min, clip_max)
        return torch.where(usable, weights, torch.zeros_like(weights))
