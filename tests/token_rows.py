"""Sampled episodes written out by hand, for the tests of what reads a batch's token ids (the
input-dependence cross-scoring): each row its token ids and action mask."""

from __future__ import annotations

import torch

from entrogym.algos import UpdateBatch


def episodes_batch(rows: list[tuple[list[int], list[int]]], groups: list[int]) -> UpdateBatch:
    """An ``UpdateBatch`` of ``rows`` (token ids, action mask; right-padded with 0) with the
    task of each row in ``groups``."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width)
    for i, (tokens, acting) in enumerate(rows):
        ids[i, : len(tokens)] = torch.tensor(tokens)
        mask[i, : len(acting)] = torch.tensor(acting, dtype=torch.float32)
    lengths = torch.tensor([len(t) for t, _ in rows])
    attention = (torch.arange(width)[None] < lengths[:, None]).long()
    return UpdateBatch.build(None, rewards=torch.zeros(len(rows)), group_ids=torch.tensor(groups),
                             mask=mask, lengths=lengths, input_ids=ids,
                             attention_mask=attention)  # fmt: skip
