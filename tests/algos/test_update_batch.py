"""UpdateBatch: group ids renumbered and advantages computed once; rows cut, never re-padded."""

from __future__ import annotations

import pytest
import torch

from entrogym.algos import UpdateBatch, grpo
from entrogym.algos.update_batch import micro_weight


def _batch(**kw) -> UpdateBatch:
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1], [0, 0, 1, 0]]).float()
    args = dict(
        rewards=torch.tensor([1.0, 0.0, 0.5, 0.25]),
        group_ids=torch.tensor([42, 42, 7, 7]),
        mask=mask,
        lengths=torch.tensor([3, 2, 4, 3]),
    )
    return UpdateBatch.build("grpo", **{**args, **kw})


def test_group_ids_are_renumbered_once_and_advantages_computed_once():
    batch = _batch()
    assert batch.group_ids.tolist() == [1, 1, 0, 0] and batch.n_groups == 2
    torch.testing.assert_close(batch.advantages, grpo(batch.rewards, torch.tensor([1, 1, 0, 0])))
    assert len(batch) == 4 and batch.old_logprobs is None


def test_rows_are_cut_to_their_longest_row_and_old_logprobs_stored_in_place():
    batch = _batch()
    index = torch.tensor([1, 3])
    assert batch.width(index) == 3
    with pytest.raises(ValueError, match="not scored yet"):
        batch.rows(index)
    batch.store_old_logprobs(index, torch.tensor([[0.0, -1.0, 0.0], [0.0, 0.0, -2.0]]))
    rows = batch.rows(index)
    assert rows.mask.shape == rows.old_logprobs.shape == (2, 3)
    assert rows.old_logprobs[1, 2] == -2.0 and batch.old_logprobs.shape == (4, 4)
    torch.testing.assert_close(rows.advantages, batch.advantages[index])
    assert micro_weight("token-mean", rows.mask, batch.mask) == pytest.approx(2 / 8)
    assert micro_weight("sequence-mean", rows.mask, batch.mask) == 0.5


def test_bad_update_batches_are_named():
    with pytest.raises(ValueError, match="old_logprobs shape"):
        _batch(old_logprobs=torch.zeros(4, 3))
    with pytest.raises(ValueError, match="action tokens past a row's length"):
        _batch(lengths=torch.tensor([2, 2, 4, 3]))
    with pytest.raises(ValueError, match="lengths must be"):
        _batch(lengths=torch.tensor([3, 2, 5, 3]))
    with pytest.raises(ValueError, match="mask must be a \\[B, T\\] tensor"):
        _batch(mask=torch.ones(4))
    with pytest.raises(
        ValueError, match="unknown advantage .ppo.; registered advantages: rloo, grpo"
    ):
        UpdateBatch.build("ppo", rewards=torch.ones(2), group_ids=[0, 0], mask=torch.ones(2, 1))
