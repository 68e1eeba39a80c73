"""Episodes -> one right-padded batch of tensors for the trainer (the collate step)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from entrogym.agents.episode import Episode


@dataclass
class Batch:
    """Padded tensors for ``B`` episodes of up to ``T`` tokens (right padding).

    ``action_mask`` marks sampled tokens; ``attention_mask`` marks real tokens;
    ``sampler_logprobs`` are the engine's log-probs (0 off the action mask); ``group_ids`` are
    the episodes' group ids (one per task group; the update renumbers them); ``rewards`` are
    terminal; ``lengths`` count each row's real tokens.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    lengths: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def tokens(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask)`` of rows ``index``, cut to their longest row."""
        t = int(self.lengths[index].max())
        return self.input_ids[index, :t], self.attention_mask[index, :t]

    def actions(self, index: torch.Tensor) -> torch.Tensor:
        """``action_mask`` of rows ``index``, cut like :meth:`tokens`."""
        return self.action_mask[index, : int(self.lengths[index].max())]

    def row(self, i: int) -> dict[str, list]:
        """Row ``i`` without padding, as plain lists (the inverse of padding)."""
        n = int(self.lengths[i])
        return {
            "token_ids": self.input_ids[i, :n].tolist(),
            "action_mask": self.action_mask[i, :n].long().tolist(),
            "sampler_logprobs": self.sampler_logprobs[i, :n].tolist(),
        }


def collate_episodes(episodes: Sequence[Episode], pad_token_id: int = 0) -> Batch:
    """Right-pad ``episodes`` into one ``Batch`` (rows in the episodes' order)."""
    if not episodes:
        raise ValueError("episodes is empty; collect rollouts first")
    for ep in episodes:
        if not isinstance(ep, Episode):
            raise ValueError(f"collate_episodes takes Episodes, got {type(ep).__name__}")
        if not ep.token_ids:
            raise ValueError(f"episode {ep.task_id!r} has no tokens")
    n, t = len(episodes), max(len(e.token_ids) for e in episodes)
    input_ids = torch.full((n, t), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, t), dtype=torch.long)
    action_mask = torch.zeros((n, t), dtype=torch.float32)
    sampler_logprobs = torch.zeros((n, t), dtype=torch.float32)
    for i, ep in enumerate(episodes):
        k = len(ep.token_ids)
        input_ids[i, :k] = torch.tensor(ep.token_ids, dtype=torch.long)
        attention_mask[i, :k] = 1
        action_mask[i, :k] = torch.tensor(ep.action_mask, dtype=torch.float32)
        sampler_logprobs[i, :k] = torch.tensor(ep.sampler_logprobs, dtype=torch.float32)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        action_mask=action_mask,
        sampler_logprobs=sampler_logprobs * action_mask,
        rewards=torch.tensor([float(e.reward) for e in episodes], dtype=torch.float32),
        group_ids=torch.tensor([e.group_id for e in episodes], dtype=torch.long),
        lengths=torch.tensor([len(e.token_ids) for e in episodes], dtype=torch.long),
    )


def usable_episodes(episodes: list[Episode]) -> list[Episode]:
    """Episodes that can enter the loss: with action tokens, in groups of at least two."""
    with_actions = [e for e in episodes if e.num_action_tokens > 0]
    sizes: dict[int, int] = {}
    for e in with_actions:
        sizes[e.group_id] = sizes.get(e.group_id, 0) + 1
    return [e for e in with_actions if sizes[e.group_id] >= 2]


def is_success(episode: Episode) -> bool:
    """Whether ``episode`` solved its task: ``info["success"]``, else a reward >= 1."""
    return bool(episode.info.get("success", episode.reward >= 1.0))


def success_rate(episodes: list[Episode]) -> float:
    """Share of episodes that solved their task (:func:`is_success`)."""
    return sum(is_success(e) for e in episodes) / len(episodes)
