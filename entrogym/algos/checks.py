"""Input validation shared by the algorithm functions.

A silent NaN or a broadcast over mismatched shapes is the worst failure an RL loss can have:
training goes on and the entropy curve is wrong. Every public function validates here and
raises a ``ValueError`` that names the offending argument.
"""

from __future__ import annotations

import torch


def as_float_tensor(name: str, value: torch.Tensor) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        value = value.to(torch.float32)
    if not torch.isfinite(value).all():
        raise ValueError(f"{name} contains NaN or inf; check the rewards/log-probs upstream")
    return value


def check_group_inputs(
    rewards: torch.Tensor, group_ids: torch.Tensor, min_group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate per-trajectory rewards and group ids; return (rewards, inverse index, counts)."""
    rewards = as_float_tensor("rewards", rewards)
    if rewards.dim() != 1 or rewards.numel() == 0:
        raise ValueError(
            f"rewards must be a non-empty 1-D tensor [B], got shape {tuple(rewards.shape)}"
        )
    if not isinstance(group_ids, torch.Tensor):
        group_ids = torch.as_tensor(group_ids)
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids shape {tuple(group_ids.shape)} must equal rewards shape {tuple(rewards.shape)}"
        )
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    if int(counts.min()) < min_group_size:
        raise ValueError(
            f"group_ids: every group needs at least {min_group_size} trajectories "
            f"(smallest has {int(counts.min())}); sample K >= 2 per task"
        )
    return rewards, inverse, counts


def check_token_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate [B, T] log-probs and mask and broadcast advantages to [B, T]."""
    if not isinstance(logprobs, torch.Tensor) or logprobs.dim() != 2:
        raise ValueError(
            f"logprobs must be a [B, T] tensor, got {getattr(logprobs, 'shape', logprobs)}"
        )
    for name, t in (("old_logprobs", old_logprobs), ("mask", mask)):
        if not isinstance(t, torch.Tensor) or t.shape != logprobs.shape:
            raise ValueError(
                f"{name} shape {tuple(getattr(t, 'shape', ()))} must equal logprobs shape "
                f"{tuple(logprobs.shape)}"
            )
    if not torch.isfinite(logprobs.detach()).all():
        raise ValueError("logprobs contains NaN or inf")
    old_logprobs = as_float_tensor("old_logprobs", old_logprobs)
    advantages = as_float_tensor("advantages", advantages)
    if advantages.dim() == 1 and advantages.shape[0] == logprobs.shape[0]:
        advantages = advantages[:, None].expand_as(logprobs)
    elif advantages.shape != logprobs.shape:
        raise ValueError(
            f"advantages must be [B] or [B, T] matching logprobs {tuple(logprobs.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    mask = mask.to(logprobs.dtype)
    per_traj = mask.sum(dim=1)
    if bool((per_traj == 0).any()):
        empty = torch.nonzero(per_traj == 0).flatten().tolist()
        raise ValueError(
            f"mask: trajectories {empty} have no action tokens; drop them before the loss"
        )
    return logprobs, old_logprobs, advantages, mask
