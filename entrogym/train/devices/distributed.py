"""Data-parallel learner under ``torchrun``: what each rank does and how ranks exchange data.

Layout (the paper's learner node; appendix "Training"): every rank holds an FSDP2 shard of the
policy (``entrogym.train.devices.fsdp``). Rank 0 alone talks to the rollout engines, evaluates and
writes files; the batch it collects is broadcast, and every rank then runs the same
``policy_update`` on it. Inside each micro-batch the rows are split over the ranks: a rank
scores only its rows and the log-probs are all-gathered *with autograd*, so the loss (and
every metric) is identical on all ranks while each backward pass touches only local rows.

Why the gradient comes out right: the all-gather's backward sums the identical upstream
gradients of the W ranks (W x the gradient of the local rows), and FSDP2's reduce-scatter
averages over ranks, so each parameter receives exactly the whole micro-batch's gradient --
the same numbers as one process (tests/train/test_distributed_train.py checks it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the learner group (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup_ranks() -> Ranks:
    """Join torchrun's process group (gloo on CPU, nccl on CUDA) when launched by it."""
    if not launched_by_torchrun():
        return Ranks()
    from entrogym.train.devices.fsdp import init_distributed

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rank, world = init_distributed(device)
    return Ranks(rank, world)


def broadcast(obj: Any, ranks: Ranks) -> Any:
    """Rank 0's ``obj`` on every rank (pickled; for batches and small decisions)."""
    if not ranks.distributed:
        return obj
    box = [obj if ranks.main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_main(fn: Callable[[], T], ranks: Ranks) -> T:
    """``fn()`` run on rank 0 only, its result handed to every rank. If it raises, every rank
    raises (rank 0 the original error), so no rank is left waiting in a collective."""
    if not ranks.distributed:
        return fn()
    result, error = None, None
    if ranks.main:
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001  (re-raised below, on every rank)
            error = exc
    result, message = broadcast((result, None if error is None else repr(error)), ranks)
    if error is not None:
        raise error
    if message is not None:
        raise RuntimeError(f"rank 0 failed, so this rank stops too: {message}")
    return result


def barrier(ranks: Ranks) -> None:
    if ranks.distributed:
        dist.barrier()


def rows_of_rank(n: int, ranks: Ranks) -> torch.Tensor:
    """The row indices (of ``n``) this rank scores, padded to the same count on every rank.

    All-gather needs equal shapes and every rank must run the same number of FSDP forwards, so
    a rank short of rows repeats the last one; ``gather_rows`` drops the repeats again.
    """
    per_rank = -(-n // ranks.world)
    index = torch.arange(ranks.rank * per_rank, (ranks.rank + 1) * per_rank)
    return index.clamp(max=n - 1)


def gather_rows(local: torch.Tensor, n: int, ranks: Ranks) -> torch.Tensor:
    """Concatenate every rank's ``local`` rows (autograd flows back to each rank's own rows)
    and keep the first ``n`` (the real rows, in their original order)."""
    if not ranks.distributed:
        return local
    from torch.distributed.nn.functional import all_gather  # the autograd-aware one

    return torch.cat(all_gather(local.contiguous()))[:n]


def gathered_adapter(model: torch.nn.Module, ranks: Ranks) -> dict[str, torch.Tensor] | None:
    """Under FSDP2, the trainable (LoRA) parameters as whole CPU tensors keyed like
    ``model.state_dict()`` -- a collective: every rank calls it, rank 0 receives the tensors.
    None in one process, where the model itself holds whole tensors."""
    if not ranks.distributed:
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_model_state_dict(model, options=options)


def optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, ranks: Ranks
) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name (the same format with and without FSDP2,
    so a run checkpointed under torchrun resumes in one process and back). Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = (
        StateDictOptions(full_state_dict=True, cpu_offload=True) if ranks.distributed else None
    )
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], ranks: Ranks
) -> None:
    """Inverse of :func:`optimizer_state`; every rank passes the whole saved state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True) if ranks.distributed else None
    set_optimizer_state_dict(model, optimizer, state, options=options)
