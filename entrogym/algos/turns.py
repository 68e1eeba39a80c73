"""Turns of multi-turn trajectories, and the turn-level advantages of per-turn rewards.

A trajectory's turns are the contiguous runs of its action mask: each assistant turn is
sampled as one run of tokens, and the env's reply (mask 0) separates it from the next. With
per-turn rewards (``--turn-rewards``) each turn ``j`` of trajectory ``i`` was paid ``r_ij``;
the action tokens of turn ``j`` get the advantage of its return-to-go, compared with the
returns-to-go of the group's other trajectories at the same turn index
(:func:`turn_advantages`). Without per-turn rewards nothing here is used: the update keeps one
advantage per trajectory.
"""

from __future__ import annotations

import torch

from entrogym.algos.advantages import compute_advantages
from entrogym.algos.checks import as_float_tensor
from entrogym.algos.registry import Part


def turn_ids(mask: torch.Tensor) -> torch.Tensor:
    """The turn of every action token, ``[B, T]`` long: 0 for the tokens of a row's first
    contiguous run of ``mask > 0``, 1 for its second run, ...; -1 off the mask."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError(f"mask must be a [B, T] tensor, got {getattr(mask, 'shape', mask)}")
    action = mask > 0
    before = torch.zeros_like(action)
    before[:, 1:] = action[:, :-1]
    starts = action & ~before
    ids = starts.long().cumsum(dim=1) - 1
    return torch.where(action, ids, torch.full_like(ids, -1))


def turn_counts(mask: torch.Tensor) -> torch.Tensor:
    """Turns (contiguous runs of ``mask > 0``) per row, ``[B]`` long."""
    return turn_ids(mask).max(dim=1).values + 1


def fold_turn_rewards(rewards: list[float], turns: int) -> list[float]:
    """One reward per turn of a trajectory with ``turns`` runs of action tokens: a reward
    paid after the last run (the env's answer to an empty last turn, or ``end_episode``'s
    when the context filled up) belongs to that run's turn, so it is added to it."""
    if turns < 1:
        raise ValueError(f"a trajectory needs at least one turn of action tokens, got {turns}")
    if len(rewards) < turns:
        raise ValueError(
            f"{len(rewards)} per-turn rewards for {turns} turns of action tokens; record one "
            "reward per turn (collect with turn_rewards=True)"
        )
    return [float(r) for r in rewards[: turns - 1]] + [float(sum(rewards[turns - 1 :]))]


def returns_to_go(turn_rewards: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """G_ij = sum over k >= j of r_ik, the undiscounted return from turn j on (Sutton & Barto,
    Sec. 3.3, with gamma = 1: the episodes are short and the reward is the task's), ``[B, J]``;
    0 past row i's ``counts[i]`` turns."""
    rewards = as_float_tensor("turn_rewards", turn_rewards)
    if rewards.dim() != 2 or counts.shape != rewards.shape[:1]:
        raise ValueError(
            f"turn_rewards must be [B, J] and counts [B], got {tuple(rewards.shape)} and "
            f"{tuple(counts.shape)}"
        )
    live = torch.arange(rewards.shape[1])[None, :] < counts[:, None]
    rewards = torch.where(live, rewards, torch.zeros_like(rewards))
    return rewards.flip(1).cumsum(1).flip(1) * live


def turn_advantages(
    advantage: str | Part,
    turn_rewards: torch.Tensor,
    counts: torch.Tensor,
    group_ids: torch.Tensor,
) -> torch.Tensor:
    """Per-turn advantages ``[B, J]``: the ``advantage`` estimator (``rloo`` or ``grpo``, as for
    terminal rewards) applied to the returns-to-go G_ij (:func:`returns_to_go`), grouped by
    (task group, turn index j). Turn j of a trajectory is thus compared with turn j of the
    trajectories of the same task that reached it: GiGPO's step-level groups (Feng et al. 2025,
    arXiv:2505.10978) with the turn index as the anchor state, undiscounted.

    One baseline per token, taken at its own turn index: per-turn-index normalised *rewards*
    summed over the remaining turns (MT-GRPO style, arXiv:2505.11821) subtract as many baseline terms as the
    trajectory has turns left, a baseline that depends on where the policy chose to stop
    (verl RFC #7244); a return-to-go compared at one turn index does not. Turn 0 is reached by
    every trajectory, so its advantages are the terminal estimator's on the episodes' returns.
    A turn index that fewer than two of a group's trajectories reached has nothing to be
    compared with: its advantage is 0. Entries past a row's turns are 0."""
    returns = returns_to_go(turn_rewards, counts)
    b, j = returns.shape
    group_ids = torch.as_tensor(group_ids)
    if group_ids.shape != (b,):
        raise ValueError(f"group_ids must be [B] = [{b}], got {tuple(group_ids.shape)}")
    _, dense = torch.unique(group_ids, return_inverse=True)
    live = torch.arange(j)[None, :] < counts[:, None]
    keys = (dense[:, None] * j + torch.arange(j)[None, :])[live]
    _, key_index, key_sizes = torch.unique(keys, return_inverse=True, return_counts=True)
    compared = key_sizes[key_index] >= 2
    values = torch.zeros(keys.shape, dtype=returns.dtype)
    if bool(compared.any()):
        values[compared] = compute_advantages(advantage, returns[live][compared], keys[compared])
    out = torch.zeros_like(returns)
    out[live] = values
    return out


def per_token_advantages(per_turn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: each action token carries the advantage of its turn (``per_turn[i, j]`` for
    the tokens of row i's turn j, :func:`turn_ids`); 0 off the mask."""
    ids = turn_ids(mask)
    if per_turn.dim() != 2 or per_turn.shape[0] != mask.shape[0]:
        raise ValueError(
            f"per-turn advantages must be [B, J] with B = {mask.shape[0]}, got "
            f"{tuple(per_turn.shape)}"
        )
    most = int(ids.max()) + 1 if ids.numel() else 0
    if most > per_turn.shape[1]:
        raise ValueError(
            f"the mask has {most} turns in a row, more than the {per_turn.shape[1]} per-turn "
            "advantages"
        )
    gathered = per_turn.gather(1, ids.clamp_min(0))
    return torch.where(ids >= 0, gathered, torch.zeros_like(gathered))
