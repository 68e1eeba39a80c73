"""Dtype names: the one list every config, engine and trainer option takes.

``fp16`` is valid for the trainer (with loss scaling) and for the vLLM engines; the ``hf``
engine takes any of the three.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import torch

DTypeName = Literal["fp32", "bf16", "fp16"]
DTYPE_NAMES: tuple[str, ...] = get_args(DTypeName)
_TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def torch_dtype(name: str) -> torch.dtype:
    """The ``torch.dtype`` of a dtype name (ValueError naming the valid ones otherwise).

    torch is imported here, not at the top, so that configs and commands can name dtypes (and
    reject bad input) without paying for importing torch."""
    if name not in _TORCH_NAMES:
        raise ValueError(f"dtype must be one of {list(DTYPE_NAMES)}, got {name!r}")
    import torch

    return getattr(torch, _TORCH_NAMES[name])


def bf16_round(values: torch.Tensor) -> torch.Tensor:
    """Round to bfloat16 (round-to-nearest-even) and back: what a bf16 output cast does to
    log-probs before the importance ratio (paper Sec. 4.1 "16-bit Quantization of Model Outputs
    Affects Clipping"). The one copy of that rounding: the theory check measures it and the
    scorer's opt-in emulation (``sequence_logprobs(..., bf16_round_logprobs=True)``, for
    experiments, not a training option) applies it."""
    import torch

    return values.to(torch.bfloat16).to(values.dtype)
