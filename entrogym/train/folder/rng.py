"""The global RNG states a checkpoint captures, so a resumed run draws what the uninterrupted
one drew next."""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch

from entrogym.train.folder.checkpoint_verify import CheckpointWarning


def rng_state() -> dict[str, Any]:
    """The global RNG states of python ``random``, numpy and torch, as tensors and plain types.

    Plain containers keep ``torch.load(weights_only=True)`` usable on the checkpoint.
    """
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np.asarray(np_state["state"]["key"]).astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npst = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": npst["bit_generator"],
            "state": {"key": npst["key"].numpy().astype(np.uint32), "pos": npst["pos"]},
            "has_gauss": npst["has_gauss"],
            "gauss": npst["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            warnings.warn(
                f"checkpoint holds CUDA RNG states for {len(cuda_states)} devices but "
                f"{torch.cuda.device_count()} are visible; CUDA RNG not restored",
                CheckpointWarning,
                stacklevel=2,
            )


def iteration_seed(seed: int, iteration: int) -> int:
    """The seed of iteration ``iteration``'s own draws in run ``seed``: its tasks, its sampling
    stream (async runs), its minibatch order; and, at ``iteration * episodes``, the first of its
    episodes' env seeds. Runs whose seeds differ by one draw disjoint seeds for their first
    million iterations (the prime 1_000_003 apart); a fresh generator per iteration makes a
    resumed run draw what the uninterrupted one drew."""
    return seed * 1_000_003 + iteration
