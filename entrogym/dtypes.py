"""Dtype names: the one list every config, engine and trainer option takes.

``fp16`` is valid for the trainer (with loss scaling) and for the vLLM engines; the ``hf``
engine takes any of the three.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

DTypeName = Literal["fp32", "bf16", "fp16"]
DTYPE_NAMES: tuple[str, ...] = get_args(DTypeName)

_TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The ``torch.dtype`` of a dtype name (ValueError naming the valid ones otherwise)."""
    if name not in _TORCH:
        raise ValueError(f"dtype must be one of {list(DTYPE_NAMES)}, got {name!r}")
    return _TORCH[name]
