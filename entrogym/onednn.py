"""oneDNN's linear kernel on CPU: ``x @ weight.T`` without MKL's sgemm.

On CPU, torch's fp32 matmul calls MKL's sgemm, which can run far below what the machine does.
At the shapes entrogym computes, on an AMD EPYC with 2 threads (docs/results.md), oneDNN's
kernel ran:

- a decode step's projections (24 rows of SmolLM2) at 274 GFLOP/s against 95-106 for sgemm in
  any layout, with the weights packed once, and at 462 against 233-282 in bf16;
- the learner's (2,328 rows) at 432-474 GFLOP/s against 208-217, with the weight as it is.

The weight stays [out, in], as ``nn.Linear`` holds it. :func:`pack` reorders it once into
oneDNN's blocked layout (what inductor's freezing pass does for a CPU linear), so that a step
of few rows does not repack it on every call; the packed copy is the weight's size and only
:func:`linear` can read it. torch is imported where it is used, as in :mod:`entrogym.dtypes`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether :func:`linear` runs for tensors on ``device`` in ``dtype``: a CPU, a torch built
    with oneDNN, fp32 or bf16."""
    import torch

    return (
        device.type == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
    )


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] reordered once for :func:`linear` (an opaque oneDNN tensor)."""
    import torch

    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` (``F.linear`` without a bias) by oneDNN, for ``weight`` [out, in]
    dense and contiguous or :func:`pack`-ed; ``x`` [..., in]. No autograd."""
    import torch

    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
