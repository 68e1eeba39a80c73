"""EpisodeBuffer: ragged Episodes -> right-padded tensors, and minibatch index splits."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from entrogym.agents.episode import Episode


@dataclass
class Batch:
    """Padded tensors for ``B`` episodes of up to ``T`` tokens (right padding).

    ``action_mask`` marks sampled tokens; ``attention_mask`` marks real tokens;
    ``sampler_logprobs`` are the engine's log-probs (0 off the action mask);
    ``group_ids`` are dense integers 0..G-1 (one per task group) and ``rewards`` are terminal.
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

    def select(self, index: torch.Tensor) -> Batch:
        """The sub-batch of rows ``index``, trimmed to its longest row."""
        t = int(self.lengths[index].max())
        return Batch(
            input_ids=self.input_ids[index, :t],
            attention_mask=self.attention_mask[index, :t],
            action_mask=self.action_mask[index, :t],
            sampler_logprobs=self.sampler_logprobs[index, :t],
            rewards=self.rewards[index],
            group_ids=self.group_ids[index],
            lengths=self.lengths[index],
        )

    def row(self, i: int) -> dict[str, list]:
        """Row ``i`` without padding, as plain lists (the inverse of padding)."""
        n = int(self.lengths[i])
        return {
            "token_ids": self.input_ids[i, :n].tolist(),
            "action_mask": self.action_mask[i, :n].long().tolist(),
            "sampler_logprobs": self.sampler_logprobs[i, :n].tolist(),
        }


class EpisodeBuffer:
    """Collects Episodes and turns them into a padded ``Batch``.

    Group ids from the episodes (any hashable ints) are mapped to dense 0..G-1 in order of first
    appearance, so advantage functions can index by them.
    """

    def __init__(self, pad_token_id: int = 0, episodes: Iterable[Episode] = ()) -> None:
        self.pad_token_id = pad_token_id
        self.episodes: list[Episode] = []
        self.extend(episodes)

    def add(self, episode: Episode) -> None:
        if not isinstance(episode, Episode):
            raise ValueError(f"EpisodeBuffer.add takes an Episode, got {type(episode).__name__}")
        if not episode.token_ids:
            raise ValueError(f"episode {episode.task_id!r} has no tokens")
        self.episodes.append(episode)

    def extend(self, episodes: Iterable[Episode]) -> None:
        for episode in episodes:
            self.add(episode)

    def __len__(self) -> int:
        return len(self.episodes)

    def to_batch(self) -> Batch:
        if not self.episodes:
            raise ValueError("EpisodeBuffer is empty; collect rollouts first")
        n, t = len(self.episodes), max(len(e.token_ids) for e in self.episodes)
        input_ids = torch.full((n, t), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((n, t), dtype=torch.long)
        action_mask = torch.zeros((n, t), dtype=torch.float32)
        sampler_logprobs = torch.zeros((n, t), dtype=torch.float32)
        dense_group: dict[int, int] = {}
        for i, ep in enumerate(self.episodes):
            k = len(ep.token_ids)
            input_ids[i, :k] = torch.tensor(ep.token_ids, dtype=torch.long)
            attention_mask[i, :k] = 1
            action_mask[i, :k] = torch.tensor(ep.action_mask, dtype=torch.float32)
            sampler_logprobs[i, :k] = torch.tensor(ep.sampler_logprobs, dtype=torch.float32)
            dense_group.setdefault(ep.group_id, len(dense_group))
        return Batch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            action_mask=action_mask,
            sampler_logprobs=sampler_logprobs * action_mask,
            rewards=torch.tensor([float(e.reward) for e in self.episodes], dtype=torch.float32),
            group_ids=torch.tensor(
                [dense_group[e.group_id] for e in self.episodes], dtype=torch.long
            ),
            lengths=torch.tensor([len(e.token_ids) for e in self.episodes], dtype=torch.long),
        )


def minibatch_indices(
    n: int, minibatch_size: int | None, generator: torch.Generator | None = None
) -> Iterator[torch.Tensor]:
    """Shuffled index chunks covering 0..n-1 once; ``None`` = one chunk with everything."""
    if n < 1:
        raise ValueError("minibatch_indices: need at least one trajectory")
    if minibatch_size is not None and minibatch_size < 1:
        raise ValueError(f"minibatch_size must be >= 1 or None, got {minibatch_size}")
    order = torch.randperm(n, generator=generator)
    size = n if minibatch_size is None else minibatch_size
    yield from order.split(size)
