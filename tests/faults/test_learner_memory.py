"""Bounded learner memory: a micro-batch holds at most ``micro_batch_tokens`` padded tokens
(rows x its longest row), so long multi-turn episodes go fewer to a forward pass.

Before this bound, a 2-iteration SmolLM2 run on a TextArena game (16 episodes of ~440 tokens,
micro-batches of 8 rows) peaked at 13.8 GB, and was OOM-killed beside another run: activation
memory grows about 2.5 MB a token for a 135M model in fp32. The tests check the micro-batches
the learner scores and that the update is the same, rather than allocate that memory.
"""

from __future__ import annotations

import pytest
import torch
from vowel_env import TINY_RUN

from entrogym.algos.update_batch import micro_batches
from entrogym.commands.train import parse_config
from entrogym.train.config import TrainConfig
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.learner.update import Learner
from entrogym.train.trainer import train


def _brute_force(order: list[int], lengths: list[int], size: int, budget: int) -> list[list[int]]:
    """Greedy chunks by a direct reading of the rule: add the next row while the chunk stays
    within ``size`` rows and ``budget`` padded tokens; a row alone always fits."""
    chunks: list[list[int]] = []
    for row in order:
        if chunks:
            grown = chunks[-1] + [row]
            if len(grown) <= size and len(grown) * max(lengths[r] for r in grown) <= budget:
                chunks[-1] = grown
                continue
        chunks.append([row])
    return chunks


def test_chunks_keep_order_and_stay_within_rows_and_padded_tokens():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 20, (1,), generator=gen))
        lengths = torch.randint(1, 700, (n,), generator=gen)
        order = torch.randperm(n, generator=gen)
        size, budget = int(torch.randint(1, 9, (1,), generator=gen)), 1024
        chunks = micro_batches(order, size, budget, lengths)
        assert [c.tolist() for c in chunks] == _brute_force(
            order.tolist(), lengths.tolist(), size, budget
        )
        assert torch.equal(torch.cat(chunks), order)
        for chunk in chunks:
            padded = len(chunk) * int(lengths[chunk].max())
            assert len(chunk) <= size and (padded <= budget or len(chunk) == 1)


def test_without_a_token_bound_chunks_are_rows_only_and_bad_bounds_are_named():
    index = torch.arange(7)
    lengths = torch.full((7,), 5000)
    assert [len(c) for c in micro_batches(index, 3, None, lengths)] == [3, 3, 1]
    assert [len(c) for c in micro_batches(index, 3, 5000, lengths)] == [1] * 7
    with pytest.raises(ValueError, match="micro_batch_tokens must be >= 1"):
        micro_batches(index, 3, 0, lengths)
    with pytest.raises(ValueError, match="needs the rows' lengths"):
        micro_batches(index, 3, 100)
    with pytest.raises(ValueError, match="micro_batch_tokens must be >= 1 or null"):
        parse_config(["--micro-batch-tokens", "0"])


def test_the_learner_scores_micro_batches_within_the_token_bound_and_learns_the_same(
    tmp_path, monkeypatch
):
    run = {**TINY_RUN, "samples": 3, "early_stop_min_per_task": 3, "max_response_tokens": 12,
           "micro_batch_size": 6, "lr": 1e-2, "max_grad_norm": 1.0}  # fmt: skip
    seen: list[tuple[int, int]] = []
    real = Learner.score

    def spy(self, batch, index, need_entropy):
        seen.append((len(index), batch.width(index)))
        return real(self, batch, index, need_entropy)

    monkeypatch.setattr(Learner, "score", spy)
    bounded = read_metrics(train(TrainConfig(**run, iterations=2, micro_batch_tokens=110,
                                             out=str(tmp_path / "bounded"))))  # fmt: skip
    assert seen and all(rows * width <= 110 or rows == 1 for rows, width in seen)
    assert 1 < max(rows for rows, _ in seen) < 6  # the bound, not the row cap, cut the chunks
    seen.clear()
    rows_only = read_metrics(train(TrainConfig(**run, iterations=2, micro_batch_tokens=None,
                                               out=str(tmp_path / "rows"))))  # fmt: skip
    assert max(rows for rows, _ in seen) == 6
    for a, b in zip(bounded, rows_only, strict=True):  # the same update, in other float sums
        for key in ("entropy", "loss", "reward_mean", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
