"""What the adapter fault tests share: the command lines of a tiny run (eval, train) and the
damage they do to an adapter's files, as a disk or a hand might."""

from __future__ import annotations

import struct
from pathlib import Path

import torch

MODEL = "tiny-random-llama"
TINY = ["--model", MODEL, "--engine", "hf", "--engine-dtype", "fp32",
        "--max-response-tokens", "4", "--max-context-tokens", "256",
        "--on-turn-budget", "step"]  # fmt: skip
EVAL = ["--env", "entrogym/Arithmetic-v0", "--max-tasks", "1"]
TRAIN = ["--env", "entrogym/Arithmetic-v0", "--iterations", "1", "--tasks-per-iter", "1",
         "--samples", "2", "--early-stop-min-per-task", "2"]  # fmt: skip


def garble_tensors(weights: Path, seed: int = 0) -> None:
    """Overwrite every tensor byte of a safetensors file with other finite values, keeping its
    header and its size: only a checksum can tell."""
    data = bytearray(weights.read_bytes())
    start = 8 + struct.unpack("<Q", bytes(data[:8]))[0]
    count = (len(data) - start) // 4
    garbage = (torch.rand(count, generator=torch.Generator().manual_seed(seed)) - 0.5).numpy()
    data[start : start + 4 * count] = garbage.tobytes()
    weights.write_bytes(bytes(data))
