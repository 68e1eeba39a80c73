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


# What a sampler's dtype option takes: a dtype name, or ``auto`` (resolved per device).
EngineDTypeName = Literal["auto", "fp32", "bf16", "fp16"]
ENGINE_DTYPE_NAMES: tuple[str, ...] = get_args(EngineDTypeName)
# CPU flags of native bf16 arithmetic: x86's AVX512-BF16 and AMX-BF16, Arm's BF16 extension.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags() -> frozenset[str] | None:
    """This CPU's feature flags from ``/proc/cpuinfo`` (x86 ``flags``, Arm ``Features``); None
    where that file is missing or lists none (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags) or None


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (a flag of :data:`BF16_CPU_FLAGS`).

    Without one torch still runs bf16, emulated through fp32: slower than fp32 and less exact.
    The flags decide where they can be read; elsewhere torch's oneDNN probe does, which is
    looser (it also says yes for plain AVX-512, where oneDNN emulates bf16)."""
    flags = cpu_flags()
    if flags is not None:
        return bool(flags & BF16_CPU_FLAGS)
    import torch

    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def cuda_has_bf16() -> bool:
    """Whether a CUDA device is present and computes bf16 natively (Ampere or newer)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
