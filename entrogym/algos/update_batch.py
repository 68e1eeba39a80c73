"""One iteration's experience, from the trainer to the update in one type, and how it is cut
into (micro-)batches.

``UpdateBatch`` is what the trainer collates its episodes into and what ``policy_update``
trains on: group ids renumbered to 0..G-1 and advantages computed once. Minibatches and
micro-batches are index tensors into it; a micro-batch's tensors are views at the width of its
own longest row, never padded back. That width is one rule, checked in one place
(:meth:`UpdateBatch.width`, :meth:`UpdateBatch.check_scores`): a scorer gets the rows' ids at
that width (:meth:`UpdateBatch.tokens`) and must return log-probs of exactly that width.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from entrogym.algos.advantages import compute_advantages
from entrogym.algos.turns import per_token_advantages, turn_advantages, turn_counts


@dataclass
class Rows:
    """The update's tensors for some rows, cut to the width of their longest row."""

    advantages: torch.Tensor  # [b], or [b, w] where the batch has per-token advantages
    old_logprobs: torch.Tensor  # [b, w]
    mask: torch.Tensor  # [b, w]
    sampler_logprobs: torch.Tensor | None = None  # [b, w]; None: the batch has none


@dataclass
class UpdateBatch:
    """``B`` trajectories of up to ``T`` tokens (right padding).

    ``rewards[B]`` are terminal rewards; ``group_ids[B]`` dense 0..G-1 (one per task group);
    ``mask[B, T]`` 1 on action (sampled) tokens; ``lengths[B]`` real tokens per row (rows are
    scored at their minibatch's longest row); ``advantages[B]`` the algorithm's estimator's
    (None until :meth:`compute_advantages`); ``old_logprobs[B, T]`` the sampling policy's
    log-probs recomputed by the trainer, or ``None`` to let ``policy_update`` score them
    (on-policy reuse) and store them here.

    An LLM batch (``entrogym.train.batch.collate_episodes``) also holds ``input_ids[B, T]``,
    ``attention_mask[B, T]`` (1 on real tokens), the engine's ``sampler_logprobs[B, T]`` (0
    off the mask; in the loss only through ``algo.is_correction``'s weights) and ``versions[B]``: the weight version
    that sampled each row (``--max-staleness``).

    Per-turn rewards (``--turn-rewards``): ``turn_rewards[B, J]`` holds what each turn of a row
    was paid (its turns are the contiguous runs of ``mask``, ``entrogym.algos.turns``; J the most
    turns of a row, 0 past a row's own), and ``rewards`` each row's return. Then
    :meth:`compute_advantages` also sets ``token_advantages[B, T]``: each action token gets the
    advantage of its turn (:func:`~entrogym.algos.turns.turn_advantages`; 0 off the mask), and
    the loss uses them instead of ``advantages``, which stay the per-trajectory ones (the
    estimator on the returns, for the metrics). Per-token advantages may also be given to
    :meth:`build` directly; their width is the mask's, checked there and in :meth:`rows`.
    Without either field a batch is what it always was.
    """

    rewards: torch.Tensor
    group_ids: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    advantages: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    sampler_logprobs: torch.Tensor | None = None
    versions: torch.Tensor | None = None
    turn_rewards: torch.Tensor | None = None
    token_advantages: torch.Tensor | None = None

    @classmethod
    def build(
        cls,
        advantage: str | None,
        *,
        rewards: torch.Tensor,
        group_ids: torch.Tensor,
        mask: torch.Tensor,
        lengths: torch.Tensor | None = None,
        old_logprobs: torch.Tensor | None = None,
        turn_rewards: torch.Tensor | None = None,
        token_advantages: torch.Tensor | None = None,
        **tokens: torch.Tensor | None,
    ) -> UpdateBatch:
        """Renumber ``group_ids`` (any ints) to 0..G-1 and compute the ``advantage`` estimator's
        advantages (``"rloo"`` or ``"grpo"``; None: later, :meth:`compute_advantages`);
        ``lengths`` default to the full width T; ``tokens``: the LLM fields; ``turn_rewards``
        ``[B, J]`` and ``token_advantages`` ``[B, T]``: per-turn rewards and per-token
        advantages (class doc)."""
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            raise ValueError(f"mask must be a [B, T] tensor, got {getattr(mask, 'shape', mask)}")
        given = (("old_logprobs", old_logprobs), ("token_advantages", token_advantages))
        for name, value in (*given, *tokens.items()):
            if name not in (*_TOKEN_FIELDS, "old_logprobs", "token_advantages"):
                raise TypeError(f"UpdateBatch has no field {name!r}")
            want = mask.shape[:1] if name == "versions" else mask.shape
            if value is not None and value.shape != want:
                raise ValueError(
                    f"{name} shape {tuple(value.shape)} must be {tuple(want)} (mask's)"
                )
        if lengths is None:
            lengths = torch.full((mask.shape[0],), mask.shape[1], dtype=torch.long)
        if lengths.shape != (mask.shape[0],) or int(lengths.max()) > mask.shape[1]:
            raise ValueError(f"lengths must be [B] with values <= T = {mask.shape[1]}")
        if bool(((mask != 0) & (torch.arange(mask.shape[1]) >= lengths[:, None])).any()):
            raise ValueError("mask: action tokens past a row's length; check lengths")
        if turn_rewards is not None:
            _check_turn_rewards(turn_rewards, mask)
        _, dense = torch.unique(torch.as_tensor(group_ids), return_inverse=True)
        batch = cls(rewards, dense, mask, lengths, old_logprobs=old_logprobs,
                    turn_rewards=turn_rewards, token_advantages=token_advantages,
                    **tokens)  # fmt: skip
        if advantage is not None:
            batch.compute_advantages(advantage)
        return batch

    def compute_advantages(self, advantage: str) -> None:
        """The ``advantage`` estimator's advantages of the rows (``"rloo"`` or ``"grpo"``), and,
        where the batch has per-turn rewards, its per-token advantages (class doc)."""
        self.advantages = compute_advantages(advantage, self.rewards, self.group_ids)
        if self.turn_rewards is not None:
            counts = turn_counts(self.mask)
            per_turn = turn_advantages(advantage, self.turn_rewards, counts, self.group_ids)
            self.token_advantages = per_token_advantages(per_turn, self.mask)

    def trajectory_signal(self) -> torch.Tensor:
        """``[B]``, 0 exactly where a row carries no policy-gradient signal: the advantages, or
        with per-token advantages each row's largest |A| over its tokens."""
        if self.token_advantages is None:
            return self.advantages
        return (self.token_advantages * (self.mask > 0)).abs().amax(dim=1)

    def __len__(self) -> int:
        return int(self.mask.shape[0])

    @property
    def n_groups(self) -> int:
        return int(self.group_ids.max()) + 1

    def micro_batches(
        self, index: torch.Tensor, size: int | None, max_tokens: int | None = None
    ) -> list[torch.Tensor]:
        """Rows ``index`` in chunks of at most ``size`` rows and ``max_tokens`` padded tokens
        (:func:`micro_batches`)."""
        return micro_batches(index, size, max_tokens, self.lengths)

    def width(self, index: torch.Tensor) -> int:
        """Tokens of the longest of rows ``index``: the width they are scored at."""
        return int(self.lengths[index].max())

    def check_scores(self, index: torch.Tensor, logprobs: torch.Tensor) -> None:
        """A scorer's log-probs of rows ``index`` must be ``[len(index), width(index)]``."""
        want = (len(index), self.width(index))
        if tuple(logprobs.shape) != want:
            raise ValueError(
                f"scores of {want[0]} rows must be {list(want)} (the rows' longest length), "
                f"got {list(logprobs.shape)}; score the ids of UpdateBatch.tokens(index)"
            )

    def tokens(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask)`` of rows ``index``, cut to ``width(index)``."""
        if self.input_ids is None or self.attention_mask is None:
            raise ValueError("this batch holds no token ids (collate_episodes makes them)")
        w = self.width(index)
        return self.input_ids[index, :w], self.attention_mask[index, :w]

    def actions(self, index: torch.Tensor) -> torch.Tensor:
        """``mask`` of rows ``index``, cut like :meth:`tokens`."""
        return self.mask[index, : self.width(index)]

    def row(self, i: int) -> dict[str, list]:
        """Row ``i`` without padding, as plain lists (the inverse of padding)."""
        n = int(self.lengths[i])
        return {
            "token_ids": self.input_ids[i, :n].tolist(),  # type: ignore[index]
            "action_mask": self.mask[i, :n].long().tolist(),
            "sampler_logprobs": self.sampler_logprobs[i, :n].tolist(),  # type: ignore[index]
        }

    def rows(self, index: torch.Tensor) -> Rows:
        if self.old_logprobs is None:
            raise ValueError("old_logprobs are not scored yet")
        if self.advantages is None:
            raise ValueError("advantages are not computed yet (compute_advantages)")
        w = self.width(index)
        sampler = None if self.sampler_logprobs is None else self.sampler_logprobs[index, :w]
        advantages = self.advantages[index]
        if self.token_advantages is not None:
            if self.token_advantages.shape != self.mask.shape:
                raise ValueError(
                    f"token_advantages shape {tuple(self.token_advantages.shape)} must be "
                    f"{tuple(self.mask.shape)} (mask's): one advantage per token"
                )
            advantages = self.token_advantages[index, :w]
        return Rows(advantages, self.old_logprobs[index, :w], self.mask[index, :w], sampler)

    def store_old_logprobs(self, index: torch.Tensor, logprobs: torch.Tensor) -> None:
        """Record rows ``index``'s old log-probs (``[b, width(index)]``, detached)."""
        self.check_scores(index, logprobs)
        if self.old_logprobs is None:
            self.old_logprobs = torch.zeros(self.mask.shape, dtype=logprobs.dtype)
        self.old_logprobs[index, : logprobs.shape[1]] = logprobs.detach()


_TOKEN_FIELDS = ("input_ids", "attention_mask", "sampler_logprobs", "versions")


def _check_turn_rewards(turn_rewards: torch.Tensor, mask: torch.Tensor) -> None:
    """``turn_rewards`` must be ``[B, J]``, J the most turns (runs of ``mask``) of a row."""
    most = int(turn_counts(mask).max()) if mask.shape[0] else 0
    want = (mask.shape[0], most)
    if not isinstance(turn_rewards, torch.Tensor) or tuple(turn_rewards.shape) != want:
        raise ValueError(
            f"turn_rewards shape {tuple(getattr(turn_rewards, 'shape', ()))} must be "
            f"{want}: one reward per turn (a contiguous run of mask) of the row with the most"
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


def minibatch_count(n: int, minibatch_size: int | None) -> int:
    """How many chunks :func:`minibatch_indices` yields for ``n`` rows."""
    return 1 if minibatch_size is None else math.ceil(n / minibatch_size)


def micro_batches(
    index: torch.Tensor,
    size: int | None,
    max_tokens: int | None = None,
    lengths: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Split one minibatch into chunks that fit in memory; their gradients are accumulated.

    A chunk holds at most ``size`` rows and, with ``max_tokens``, at most that many tokens
    once padded to its longest row (``lengths``: every row's tokens, indexed by ``index``'s
    values). Rows keep their order; a row longer than ``max_tokens`` is a chunk of its own.
    The learner's activation memory grows with a chunk's padded tokens (about 2.5 MB a token
    for a 135M model in fp32), so multi-turn episodes need the token bound, not just rows.
    """
    if size is not None and size < 1:
        raise ValueError(f"micro_batch_size must be >= 1 or None, got {size}")
    if max_tokens is None:
        return [index] if size is None else list(index.split(size))
    if max_tokens < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1 or None, got {max_tokens}")
    if lengths is None:
        raise ValueError("micro_batches: max_tokens needs the rows' lengths")
    most = size or len(index)
    chunks: list[list[int]] = []
    widths: list[int] = []  # each chunk's longest row
    for row in index.tolist():
        n = int(lengths[row])
        if (
            chunks
            and len(chunks[-1]) < most
            and (len(chunks[-1]) + 1) * max(widths[-1], n) <= max_tokens
        ):
            chunks[-1].append(row)
            widths[-1] = max(widths[-1], n)
        else:
            chunks.append([row])
            widths.append(n)
    return [torch.tensor(chunk, dtype=index.dtype) for chunk in chunks]


def micro_weight(aggregation: str, chunk_mask: torch.Tensor, minibatch_mask: torch.Tensor) -> float:
    """The chunk's share of the minibatch loss, so accumulated gradients equal the whole one's.

    ``sequence-mean`` averages over trajectories (share = trajectories in the chunk), while
    ``token-mean`` averages over action tokens (share = action tokens in the chunk).
    """
    if aggregation == "token-mean":
        return float(chunk_mask.sum() / minibatch_mask.sum())
    return chunk_mask.shape[0] / minibatch_mask.shape[0]
