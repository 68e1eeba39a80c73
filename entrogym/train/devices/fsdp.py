"""FSDP2 wrap of the policy: ``fully_shard`` per decoder layer and at the root.

PyTorch's default ``MixedPrecisionPolicy`` casts nothing on the way out, so a model whose
parameters are gathered in bf16 returns bf16 outputs; the paper's fix (appendix "Numerical
considerations") is ``output_dtype=torch.float32``. Gradients are reduced in fp32. The exact
log-prob path upcasts the hidden states and head weight itself, so it stays fp32 either way;
the policy matters for anything that reads the model's outputs directly.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from entrogym.train.devices.precision import resolve_dtype


def mixed_precision_policy(
    param_dtype: str | torch.dtype = "bf16",
    output_dtype: str | torch.dtype | None = torch.float32,
) -> MixedPrecisionPolicy:
    """fp32 gradient reduction and (unless ``output_dtype=None``, PyTorch's default) fp32 outputs."""
    return MixedPrecisionPolicy(
        param_dtype=resolve_dtype(param_dtype),
        reduce_dtype=torch.float32,
        output_dtype=None if output_dtype is None else resolve_dtype(output_dtype),
    )


def _hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks: modules of the classes transformers marks as not splittable."""
    hf = _hf_model(model)
    names = set(getattr(hf, "_no_split_modules", None) or [])
    layers = [m for m in hf.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"found no decoder layers in {type(hf).__name__} (its _no_split_modules is {names}); "
            "FSDP2 wrapping supports transformers causal LMs"
        )
    return layers


def shard_policy(
    model: torch.nn.Module,
    *,
    param_dtype: str | torch.dtype = "bf16",
    output_dtype: str | torch.dtype | None = torch.float32,
    mesh=None,
    reshard_after_forward: bool = True,
) -> torch.nn.Module:
    """Apply FSDP2 in place and return ``model``; call after LoRA is attached.

    The root is the transformers model (inside the peft wrapper), so the embeddings, final norm
    and LM head form the root's group and one all-gather serves tied weights.
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "FSDP2 needs torch.distributed to be initialised; launch with torchrun and call "
            "entrogym.train.devices.fsdp.init_distributed() first"
        )
    # Only the root casts its outputs: a layer handing fp32 activations to the next bf16 group
    # would meet bf16 weights outside FSDP's input cast (the final norm and the LM head).
    layer_policy = mixed_precision_policy(param_dtype, output_dtype=None)
    for layer in decoder_layers(model):
        fully_shard(
            layer, mesh=mesh, mp_policy=layer_policy, reshard_after_forward=reshard_after_forward
        )
    root_policy = mixed_precision_policy(param_dtype, output_dtype)
    fully_shard(_hf_model(model), mesh=mesh, mp_policy=root_policy, reshard_after_forward=False)
    return model


def init_distributed(device: str | torch.device = "cpu") -> tuple[int, int]:
    """Initialise the process group from torchrun's environment: gloo on CPU, nccl on CUDA."""
    if "RANK" not in os.environ:
        raise RuntimeError("init_distributed() expects torchrun's environment (RANK, WORLD_SIZE)")
    device = torch.device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return dist.get_rank(), dist.get_world_size()


def full_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    """A parameter's whole gradient (all-gathered when FSDP2 holds it as a sharded DTensor)."""
    if param.grad is None:
        return None
    grad = param.grad
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad
