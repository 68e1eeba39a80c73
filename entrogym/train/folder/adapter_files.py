"""What makes an adapter folder safe to hand on: finite weights, checked before it is written.

Every adapter entrogym writes (``adapters/vNNNNNN`` for the engines, a checkpoint's
``adapter/``) goes through :func:`finite_adapter_weights` first: a version whose weights hold a
NaN or an inf is neither published nor checkpointed (the engines would sample from NaN logits,
a resume would train on from them).
"""

from __future__ import annotations

from typing import Any

import torch


class NonFiniteWeights(ArithmeticError):
    """Adapter weights that are not finite were about to be written; nothing was."""


def adapter_tensors(
    model: torch.nn.Module, weights: dict[str, torch.Tensor] | None
) -> dict[str, Any]:
    """The tensors an adapter folder of ``model`` holds: ``weights`` when given (gathered from
    an FSDP2-sharded model), else the peft adapter's state (a plain module's whole state)."""
    if weights is not None:
        return weights
    if hasattr(model, "peft_config"):
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(model)
    return model.state_dict()


def finite_adapter_weights(
    model: torch.nn.Module, weights: dict[str, torch.Tensor] | None, where: str
) -> None:
    """Raise :class:`NonFiniteWeights` (one line naming ``where`` and a tensor) unless every
    adapter weight is finite."""
    tensors = adapter_tensors(model, weights)
    bad = [
        name
        for name, t in tensors.items()
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(t.isfinite().all())
    ]
    if bad:
        raise NonFiniteWeights(
            f"the adapter weights are not finite (NaN or inf in {len(bad)} of {len(tensors)} "
            f"tensors, e.g. {bad[0]}), so {where} was not written; the run diverged: lower "
            "--lr, or go on from an earlier checkpoint"
        )
