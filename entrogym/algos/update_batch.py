"""One iteration's experience as the update sees it, and how it is cut into (micro-)batches.

``UpdateBatch`` is built once per iteration: group ids renumbered to 0..G-1 and advantages
computed here, once. Minibatches and micro-batches are index tensors into it; a micro-batch's
tensors are views at the width of its own longest row (``lengths``), never padded back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from entrogym.algos.advantages import compute_advantages


@dataclass
class Rows:
    """The update's tensors for some rows, cut to the width of their longest row."""

    advantages: torch.Tensor  # [b]
    old_logprobs: torch.Tensor  # [b, w]
    mask: torch.Tensor  # [b, w]


@dataclass
class UpdateBatch:
    """``B`` trajectories of up to ``T`` tokens (right padding).

    ``rewards[B]`` are terminal rewards; ``group_ids[B]`` dense 0..G-1 (one per task group);
    ``advantages[B]`` the preset's estimator's; ``mask[B, T]`` 1 on action tokens;
    ``lengths[B]`` real tokens per row (rows are scored at their minibatch's longest row);
    ``old_logprobs[B, T]`` the sampling policy's log-probs recomputed by the trainer, or
    ``None`` to let ``policy_update`` score them (on-policy reuse) and store them here.
    """

    rewards: torch.Tensor
    group_ids: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    old_logprobs: torch.Tensor | None = None

    @classmethod
    def build(
        cls,
        advantage: str,
        *,
        rewards: torch.Tensor,
        group_ids: torch.Tensor,
        mask: torch.Tensor,
        lengths: torch.Tensor | None = None,
        old_logprobs: torch.Tensor | None = None,
    ) -> UpdateBatch:
        """Renumber ``group_ids`` (any ints) to 0..G-1 and compute the ``advantage`` estimator's
        advantages (``"rloo"`` or ``"grpo"``); ``lengths`` default to the full width T."""
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            raise ValueError(f"mask must be a [B, T] tensor, got {getattr(mask, 'shape', mask)}")
        if old_logprobs is not None and old_logprobs.shape != mask.shape:
            raise ValueError(
                f"old_logprobs shape {tuple(old_logprobs.shape)} must equal mask shape "
                f"{tuple(mask.shape)}"
            )
        if lengths is None:
            lengths = torch.full((mask.shape[0],), mask.shape[1], dtype=torch.long)
        if lengths.shape != (mask.shape[0],) or int(lengths.max()) > mask.shape[1]:
            raise ValueError(f"lengths must be [B] with values <= T = {mask.shape[1]}")
        if bool(((mask != 0) & (torch.arange(mask.shape[1]) >= lengths[:, None])).any()):
            raise ValueError("mask: action tokens past a row's length; check lengths")
        _, dense = torch.unique(torch.as_tensor(group_ids), return_inverse=True)
        advantages = compute_advantages(advantage, rewards, dense)
        return cls(rewards, dense, advantages, mask, lengths, old_logprobs)

    def __len__(self) -> int:
        return int(self.mask.shape[0])

    @property
    def n_groups(self) -> int:
        return int(self.group_ids.max()) + 1

    def width(self, index: torch.Tensor) -> int:
        """Tokens of the longest of rows ``index``: the width they are scored at."""
        return int(self.lengths[index].max())

    def rows(self, index: torch.Tensor) -> Rows:
        if self.old_logprobs is None:
            raise ValueError("old_logprobs are not scored yet")
        w = self.width(index)
        return Rows(self.advantages[index], self.old_logprobs[index, :w], self.mask[index, :w])

    def store_old_logprobs(self, index: torch.Tensor, logprobs: torch.Tensor) -> None:
        """Record rows ``index``'s old log-probs (``[b, width(index)]``, detached)."""
        if self.old_logprobs is None:
            self.old_logprobs = torch.zeros(self.mask.shape, dtype=logprobs.dtype)
        self.old_logprobs[index, : logprobs.shape[1]] = logprobs.detach()


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


def micro_batches(index: torch.Tensor, size: int | None) -> list[torch.Tensor]:
    """Split one minibatch into chunks that fit in memory; their gradients are accumulated."""
    if size is not None and size < 1:
        raise ValueError(f"micro_batch_size must be >= 1 or None, got {size}")
    return [index] if size is None else list(index.split(size))


def micro_weight(aggregation: str, chunk_mask: torch.Tensor, minibatch_mask: torch.Tensor) -> float:
    """The chunk's share of the minibatch loss, so accumulated gradients equal the whole one's.

    ``sequence-mean`` averages over trajectories (share = trajectories in the chunk), while
    ``token-mean`` averages over action tokens (share = action tokens in the chunk).
    """
    if aggregation == "token-mean":
        return float(chunk_mask.sum() / minibatch_mask.sum())
    return chunk_mask.shape[0] / minibatch_mask.shape[0]
