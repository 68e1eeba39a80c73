"""Sampler/trainer mismatch: how far the engine's log-probs are from the trainer's.

The trainer recomputes old log-probs itself (paper Sec. 4, appendix "Numerical
considerations"), so this metric is a diagnostic of the rollout engine: the same tokens scored
by the sampler (vLLM in bf16 or fp32) and by the trainer (fp32) should give importance ratios
near 1. A ratio outside [0.9, 1.1] on a token is what clipping with eps = 0.1 would act on even
though the policy did not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from entrogym.agents.episode import Episode


def sampler_mismatch(
    trainer_logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    *,
    low: float = 0.9,
    high: float = 1.1,
) -> dict[str, float]:
    """Compare log-probs of the same tokens over the action ``mask``.

    With diff = trainer - sampler and ratio = exp(diff) (the importance ratio pi_trainer /
    pi_sampler): ``mean_abs_diff``, ``max_abs_diff``, ``mean_diff`` (signed),
    ``frac_ratio_outside`` (share of tokens whose ratio leaves [low, high]) and ``num_tokens``.
    """
    if trainer_logprobs.shape != sampler_logprobs.shape or trainer_logprobs.shape != mask.shape:
        raise ValueError(
            "trainer_logprobs, sampler_logprobs and mask must have one shape, got "
            f"{tuple(trainer_logprobs.shape)}, {tuple(sampler_logprobs.shape)}, {tuple(mask.shape)}"
        )
    sel = mask.bool()
    diff = trainer_logprobs.double()[sel] - sampler_logprobs.double()[sel]
    if diff.numel() == 0:
        raise ValueError("mask selects no tokens; pass the action mask of sampled tokens")
    ratio = diff.exp()
    return {
        "mean_abs_diff": float(diff.abs().mean()),
        "max_abs_diff": float(diff.abs().max()),
        "mean_diff": float(diff.mean()),
        "frac_ratio_outside": float(((ratio < low) | (ratio > high)).double().mean()),
        "num_tokens": int(diff.numel()),
    }


def score_episodes(
    model: torch.nn.Module,
    episodes: Sequence[Episode],
    *,
    batch_size: int = 8,
    pad_token_id: int = 0,
    **logprob_opts: Any,
) -> tuple[Tensor, Tensor, Tensor]:
    """Trainer log-probs of ``episodes``' tokens with ``model`` (fp32, ``sequence_logprobs``).

    Returns ``(trainer_logprobs, sampler_logprobs, action_mask)``, each ``[B, T]``.
    """
    from entrogym.train.batch import collate_episodes
    from entrogym.train.logprobs import sequence_logprobs

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batch = collate_episodes(episodes, pad_token_id)
    device = next(model.parameters()).device
    out = torch.zeros_like(batch.sampler_logprobs)
    with torch.no_grad():
        for start in range(0, len(batch), batch_size):
            rows = slice(start, start + batch_size)
            out[rows] = sequence_logprobs(
                model,
                batch.input_ids[rows].to(device),
                batch.attention_mask[rows].to(device),
                **logprob_opts,
            ).cpu()
    return out, batch.sampler_logprobs, batch.action_mask


def episodes_mismatch(
    model: torch.nn.Module, episodes: Sequence[Episode], **kwargs: Any
) -> dict[str, float]:
    """:func:`sampler_mismatch` of ``episodes`` scored by ``model`` (see :func:`score_episodes`)."""
    low, high = kwargs.pop("low", 0.9), kwargs.pop("high", 1.1)
    trainer, sampler, mask = score_episodes(model, episodes, **kwargs)
    return sampler_mismatch(trainer, sampler, mask, low=low, high=high)
