"""A LoRA layer's forward and backward as one function: ``y = x W^T + s (x A^T) B^T``.

peft's ``lora.Linear`` computes the frozen base product and then, as separate autograd ops,
``lora_B(lora_A(x)) * s`` and the sum. On CPU each op walks a ``[tokens, out]`` tensor: the
product by ``s``, the sum, and in the backward their gradients, a copy and another sum for x's
two gradient paths. The LoRA products themselves are skinny (rank 16), so these elementwise
passes, not FLOPs, set their cost: one SmolLM2 micro-batch's forward and backward took 1.75 s
through peft's layers and 1.52 s through these (docs/results.md).

:class:`FusedLoraLinear` computes the same layer in one :class:`torch.autograd.Function`
(Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", eq. 3), with
``h = x A^T``:

- forward: ``y = x W^T`` (oneDNN, :mod:`entrogym.onednn`), then ``y += s h B^T`` inside one
  ``addmm`` (the GEMM adds into ``y``: no ``[tokens, out]`` temporaries);
- backward, for ``g = dL/dy``: ``dL/dB = s g^T h``, ``dL/dA = s (g B)^T x`` and
  ``dL/dx = g W + s (g B) A``, the last again one ``addmm`` into the base gradient.

It saves what peft's ops save (x and h; W is the frozen weight). The values are peft's up to
fp32 rounding (the sum is rounded once, not twice). It runs only where the base layer would
use oneDNN and the layer is plain LoRA (one active adapter, no dropout, no DoRA or LoRA bias,
not merged); anything else goes to peft's own forward.
"""

from __future__ import annotations

from typing import Any

import torch
from peft.tuners.lora import Linear as PeftLoraLinear

from entrogym import onednn


def lora_forward(
    x: torch.Tensor, weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x W^T + s (x A^T) B^T, x A^T)`` for ``x`` [N, in], ``weight`` [out, in], ``a``
    [r, in], ``b`` [out, r]; the second is what the backward needs."""
    h = x @ a.t()
    y = onednn.linear(x, weight)
    y.addmm_(h, b.t(), alpha=scaling)
    return y, h


def lora_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    h: torch.Tensor,
    weight: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scaling: float,
    need_x: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The gradients ``(dL/dx, dL/dA, dL/dB)`` of :func:`lora_forward`'s ``y`` for ``grad`` =
    dL/dy [N, out]: ``g W + s (g B) A``, ``s (g B)^T x`` and ``s g^T h`` (the first None
    unless ``need_x``)."""
    gb_h = grad @ b  # [N, r]
    grad_x = None
    if need_x:
        # through the frozen base by oneDNN with W^T as its [out, in]: a copy that lives for
        # this call only (one layer's weight), as FrozenLinear's backward makes
        grad_x = onednn.linear(grad, weight.t().contiguous())
        grad_x.addmm_(gb_h, a, alpha=scaling)
    grad_a = torch.mm(gb_h.t(), x).mul_(scaling)
    grad_b = torch.mm(grad.t(), h).mul_(scaling)
    return grad_x, grad_a, grad_b


class _LoraLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x, weight, a, b, scaling: float):  # type: ignore[override]
        y, h = lora_forward(x, weight, a, b, scaling)
        ctx.save_for_backward(x, h, weight, a, b)
        ctx.scaling = scaling
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        x, h, weight, a, b = ctx.saved_tensors
        grad_x, grad_a, grad_b = lora_backward(
            grad.contiguous(), x, h, weight, a, b, ctx.scaling, ctx.needs_input_grad[0]
        )
        return grad_x, None, grad_a, grad_b, None


class FusedLoraLinear(PeftLoraLinear):
    """peft's ``lora.Linear`` computing plain LoRA by :class:`_LoraLinearFunction` where it can
    (module docstring); peft's forward everywhere else. Parameters, state dict, merging and
    saving are peft's."""

    def _fused_adapter(self, x: torch.Tensor, args: tuple, kwargs: dict) -> str | None:
        """The one adapter to fuse, or None where peft's forward must run."""
        if args or kwargs or self.disable_adapters or self.merged:
            return None
        active = [name for name in self.active_adapters if name in self.lora_A]
        if len(active) != 1 or active[0] in self.lora_variant:
            return None
        name = active[0]
        base, a, b = self.base_layer, self.lora_A[name], self.lora_B[name]
        weight = base.weight
        if (
            type(base) is not onednn.FrozenLinear
            or weight.requires_grad
            or not isinstance(self.lora_dropout[name], torch.nn.Identity)
            or a.bias is not None
            or b.bias is not None
            or not x.dtype == weight.dtype == a.weight.dtype == b.weight.dtype
            or not onednn.supported(x.device, x.dtype)
        ):
            return None
        return name

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        name = self._fused_adapter(x, args, kwargs)
        if name is None:
            return super().forward(x, *args, **kwargs)
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        y = _LoraLinearFunction.apply(
            flat,
            self.base_layer.weight,
            self.lora_A[name].weight,
            self.lora_B[name].weight,
            float(self.scaling[name]),
        )
        if self.base_layer.bias is not None:
            y = y + self.base_layer.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


def use_fused_lora(model: torch.nn.Module) -> int:
    """Make every peft ``lora.Linear`` of ``model`` a :class:`FusedLoraLinear` (in place;
    nothing else changes); how many were. Run after
    :func:`entrogym.onednn.use_for_frozen_linears`, which makes their base layers oneDNN's."""
    count = 0
    for module in model.modules():
        if type(module) is PeftLoraLinear:
            module.__class__ = FusedLoraLinear
            count += 1
    return count
