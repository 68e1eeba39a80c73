"""Dtype names: the one list every config, engine and trainer option takes.

``fp16`` is valid for the trainer (with loss scaling) and for the vLLM engines; the ``hf``
engine takes any of the three.
"""

from __future__ import annotations

import os
from pathlib import Path
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


# What a sampler's dtype option takes: a dtype name, or ``auto`` (resolved per device).
EngineDTypeName = Literal["auto", "fp32", "bf16", "fp16"]
ENGINE_DTYPE_NAMES: tuple[str, ...] = get_args(EngineDTypeName)
# CPU flags (x86 ``flags`` / aarch64 ``Features`` in /proc/cpuinfo) that mean native matmuls
# in the dtype; without them oneDNN emulates it through fp32, slower than fp32 and less exact.
NATIVE_CPU_FLAGS: dict[str, tuple[str, ...]] = {
    "bf16": ("avx512_bf16", "amx_bf16", "bf16"),
    "fp16": ("avx512_fp16", "amx_fp16", "asimdhp"),
}


def cpu_flags(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags, or an empty set where /proc/cpuinfo is not readable."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


def cpu_has_native(dtype: str | torch.dtype, flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU computes ``dtype`` (a name or a ``torch.dtype``) natively; fp32 always.
    The flags decide where they can be read; elsewhere (macOS, ...) oneDNN's probe does, which
    knows the ISA it dispatches to."""
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    name = {torch_name: short for short, torch_name in _TORCH_NAMES.items()}.get(name, name)
    if name not in NATIVE_CPU_FLAGS:
        return True
    flags = cpu_flags() if flags is None else flags
    if flags:
        return any(f in flags for f in NATIVE_CPU_FLAGS[name])
    import torch

    probe = "_is_mkldnn_bf16_supported" if name == "bf16" else "_is_mkldnn_fp16_supported"
    try:
        return bool(getattr(torch.ops.mkldnn, probe)())
    except (AttributeError, RuntimeError):
        return False


def cuda_has_bf16() -> bool:
    """Whether a CUDA device is present and computes bf16 natively (Ampere or newer)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
