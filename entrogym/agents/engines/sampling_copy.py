"""The static decoder's sampling copy of the weights: each adapter version merged into the base
weights once (:func:`merged_weight`) and stored the way a decode step's few rows multiply it
fastest (:class:`Projection`), and which adapters can be merged at all
(:func:`adapter_unsupported_reason`)."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from entrogym import onednn
from entrogym.agents.engines import decode_kernel


def adapter_unsupported_reason(peft_config: Any) -> str | None:
    """Why an adapter cannot be merged here (None: it can): only plain LoRA on linear layers."""
    if getattr(peft_config, "use_dora", False):
        return "it uses DoRA"
    if getattr(peft_config, "bias", "none") != "none":
        return f"it trains biases (bias={peft_config.bias!r})"
    if getattr(peft_config, "modules_to_save", None):
        return "it saves whole modules (modules_to_save)"
    return None


def merged_weight(module: torch.nn.Module, adapter: str | None) -> torch.Tensor:
    """``module``'s weight with ``adapter`` merged in (peft's ``get_delta_weight``:
    ``scaling * B A``, transposed for ``fan_in_fan_out``); the base weight itself when the
    module carries no such adapter (or ``adapter`` is None)."""
    base = getattr(module, "base_layer", module)
    if base.bias is not None:
        raise ValueError(f"{type(base).__name__} has a bias; the static path has none")
    weight = base.weight
    if adapter is not None and adapter in getattr(module, "lora_A", {}):
        with torch.no_grad():
            weight = weight + module.get_delta_weight(adapter).to(weight.dtype)
    return weight.detach()


def kernel_pack(modules: list[torch.nn.Module], adapter: str | None) -> torch.Tensor | None:
    """``modules``' weights (stacked along the output: q|k|v, gate|up, or one) with ``adapter``
    merged in, packed straight into :func:`decode_kernel.linear`'s layout in one pass
    (:func:`decode_kernel.linear_pack_into`: ``W + scaling * B A`` from each module's own LoRA
    factors and scaling, as peft's ``get_delta_weight`` forms it); None where that does not
    apply and :func:`merged_weight` must (weights not fp32, an output width not a multiple of
    16, a ``fan_in_fan_out`` layer)."""
    bases = [getattr(m, "base_layer", m) for m in modules]
    for base in bases:
        if base.bias is not None:
            raise ValueError(f"{type(base).__name__} has a bias; the static path has none")
    merging = [adapter is not None and adapter in getattr(m, "lora_A", {}) for m in modules]
    if any(b.weight.dtype != torch.float32 or b.weight.shape[0] % 16 for b in bases):
        return None
    if any(m.fan_in_fan_out for m, merge in zip(modules, merging, strict=True) if merge):
        return None
    rows = sum(base.weight.shape[0] for base in bases)
    packed = torch.empty(rows // 16, bases[0].weight.shape[1], 16)
    row = 0
    with torch.no_grad():
        for module, base, merge in zip(modules, bases, merging, strict=True):
            if merge:
                b, a = module.lora_B[adapter].weight, module.lora_A[adapter].weight
                scaling = module.scaling[adapter]
                decode_kernel.linear_pack_into(packed, row, base.weight, b, a, scaling)
            else:
                decode_kernel.linear_pack_into(packed, row, base.weight)
            row += base.weight.shape[0]
    return packed


# Kernel projections of weights no adapter touches (an adapter-free LM head, often the tied
# input embedding: 113 MB of SmolLM2's 537), by the weights' identities: packed once and shared
# by every adapter version's sampling copy, where each version packed its own again.
_SHARED: dict[tuple[int, ...], tuple[list[weakref.ref], list[int], Projection]] = {}


def shared_kernel_projection(modules: list[torch.nn.Module]) -> Projection | None:
    """The kernel projection of ``modules``' base weights (:func:`kernel_pack` with no adapter),
    packed once while those weights live unchanged (the same tensors, at the same in-place
    version) and shared by every caller; None where :func:`kernel_pack` does not apply."""
    weights = [getattr(m, "base_layer", m).weight for m in modules]
    for key in [k for k, (refs, _, _) in _SHARED.items() if any(r() is None for r in refs)]:
        del _SHARED[key]  # weights that are gone
    key = tuple(id(w) for w in weights)
    hit = _SHARED.get(key)
    versions = [w._version for w in weights]
    if hit and all(r() is w for r, w in zip(hit[0], weights, strict=True)) and hit[1] == versions:
        return hit[2]
    stored = kernel_pack(modules, None)
    if stored is None:
        return None
    projection = Projection.kernel_packed(stored, stored.shape[0] * 16)
    _SHARED[key] = ([weakref.ref(w) for w in weights], versions, projection)
    return projection


def input_major(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] stored as its transpose [in, out], so that a step computes
    ``x @ w`` instead of ``F.linear(x, weight)``. At a decode step's few rows the layouts run
    at very different speeds on CPU: with 24 rows of SmolLM2's widths and 2 threads, MKL ran
    ``F.linear`` at 31-44 GFLOP/s and ``x @ w`` at 62-137 (from 96 rows on they are alike;
    ``benchmarks/studies/matmul_layout.py``, docs/results.md). Whole decode steps ran 1.34x faster
    with 2 threads, 1.04x with 1. The sampling copy is built once per adapter version, so its
    layout costs one transpose."""
    return weight.t().contiguous()


class Projection:
    """``x @ weight.T`` for a merged weight [out, in], stored the way a decode step's few rows
    compute it fastest.

    ``kernel``: packed for the decoder's own fp32 kernel (:func:`decode_kernel.linear`), which
    streams each weight once per step: at 24 rows of SmolLM2 on an AMD EPYC (2 threads) it ran
    a step's projections at 430 GFLOP/s against oneDNN's 293 (idle; docs/results.md).
    ``packed``: reordered once for oneDNN's linear kernel (:func:`entrogym.onednn.pack`), so
    that no step repacks it. At 24 rows of SmolLM2, streaming 30 layers' weights as a step
    does, oneDNN ran the step's matmuls at 292 GFLOP/s in fp32 against 88-110 for MKL's sgemm
    in any layout, and at 498 GFLOP/s in bf16 against 252-301 (2 threads, an AMD EPYC;
    ``benchmarks/studies/onednn_kernels.py``, docs/results.md). Either packed copy is the weight's
    size. Otherwise (a GPU, a torch without oneDNN, or bf16 on a CPU without native bf16):
    stored :func:`input_major`."""

    def __init__(self, weight: torch.Tensor, packed: bool, kernel: bool = False) -> None:
        self.out = weight.shape[0]
        self.kernel = kernel
        self.packed = packed or kernel
        if kernel:
            self.weight = decode_kernel.linear_pack(weight)
        elif packed:
            self.weight = onednn.pack(weight)
        else:
            self.weight = input_major(weight)

    @classmethod
    def kernel_packed(cls, packed: torch.Tensor, out: int) -> Projection:
        """A ``kernel`` projection of a weight already in :func:`decode_kernel.linear`'s layout
        (:func:`kernel_pack`), of ``out`` output features."""
        projection = cls.__new__(cls)
        projection.out, projection.kernel, projection.packed = out, True, True
        projection.weight = packed
        return projection

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel:
            rows = x.reshape(-1, x.shape[-1])
            return decode_kernel.linear(rows, self.weight, self.out).view(*x.shape[:-1], -1)
        return onednn.linear(x, self.weight) if self.packed else x @ self.weight

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + self(x)`` in one call, for ``x`` [N, in] (a residual connection)."""
        if self.kernel:
            return decode_kernel.linear(x, self.weight, self.out, residual)
        if self.packed:
            return onednn.linear_add(x, self.weight, residual)
        return torch.addmm(residual, x, self.weight)
