"""oneDNN's linear kernel on CPU: ``x @ weight.T`` without MKL's sgemm.

On CPU, torch's fp32 matmul calls MKL's sgemm, which can run far below what the machine does.
At the shapes entrogym computes, on an AMD EPYC with 2 threads (``benchmarks/studies/onednn_kernels.py``,
docs/results.md), oneDNN's kernel ran:

- a decode step's projections (24 rows of SmolLM2) at 292 GFLOP/s against 88-110 for sgemm in
  any layout, with the weights packed once, and at 498 against 252-301 in bf16;
- the learner's (2,328 rows) at 420-461 GFLOP/s against 214-218, with the weight as it is,
  and its gradient for the input at 386-411 against 215-219.

The weight stays [out, in], as ``nn.Linear`` holds it. :func:`pack` reorders it once into
oneDNN's blocked layout (what inductor's freezing pass does for a CPU linear), so that a step
of few rows does not repack it on every call; the packed copy is the weight's size and only
:func:`linear` can read it. :class:`FrozenLinear` puts the kernel under a LoRA policy's frozen
base layers, gradient included.
"""

from __future__ import annotations

import torch

from entrogym.dtypes import cpu_has_native


def supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether :func:`linear` runs for tensors on ``device`` in ``dtype``: a CPU, a torch built
    with oneDNN, fp32, or bf16 where the CPU computes it natively (``cpu_has_native``: elsewhere
    oneDNN emulates it, or has no bf16 kernel at all)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and cpu_has_native("bf16"))


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] reordered once for :func:`linear` (an opaque oneDNN tensor)."""
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` (``F.linear`` without a bias) by oneDNN, for ``weight`` [out, in]
    dense and contiguous or :func:`pack`-ed; ``x`` [..., in]. No autograd."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def linear_add(x: torch.Tensor, weight: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``other + x @ weight.T`` by oneDNN in one call (the sum as the kernel's post-op, in the
    output's precision, as a separate add rounds it): a residual connection's projection and
    add. ``weight`` as :func:`linear` takes it; ``other`` the output's shape. No autograd."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, weight, None, "add")


class _FrozenLinearFunction(torch.autograd.Function):
    """``x @ weight.T`` and x's gradient by oneDNN; the weight is frozen (no gradient)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, weight: torch.Tensor):
        ctx.save_for_backward(weight)
        return linear(x.contiguous(), weight)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor):
        (weight,) = ctx.saved_tensors  # type: ignore[attr-defined]
        # x's gradient is grad @ weight: oneDNN's linear with weight.T as its [out, in]; the
        # transposed copy lives for this call only (one layer's weight)
        return linear(grad.contiguous(), weight.t().contiguous()), None


class FrozenLinear(torch.nn.Linear):
    """An ``nn.Linear`` that multiplies by oneDNN while its weight is frozen (a LoRA policy's
    base layers) and the input is one :func:`supported` takes; ``nn.Linear`` otherwise. Its
    parameters, state dict and ``isinstance`` checks are ``nn.Linear``'s."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if weight.requires_grad or x.dtype != weight.dtype or not supported(x.device, x.dtype):
            return super().forward(x)
        out = _FrozenLinearFunction.apply(x, weight)
        return out if self.bias is None else out + self.bias


def use_for_frozen_linears(model: torch.nn.Module) -> int:
    """Make every plain ``nn.Linear`` of ``model`` whose weight is frozen a :class:`FrozenLinear`
    (in place; nothing else changes); how many were."""
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and not module.weight.requires_grad:
            module.__class__ = FrozenLinear
            count += 1
    return count
