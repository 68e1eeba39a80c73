"""One copy of the frozen base weights for a LoRA learner and an in-process ``hf`` engine.

A LoRA run never changes the base model's weights, so the learner and the ``hf`` engine need
not hold a copy each (for SmolLM2-135M in fp32, about 520 MB of resident memory each). :func:`frozen_base_tensors` lists the learner's frozen tensors under the plain model's
names, and :func:`model_on_tensors` builds the engine's model around those same tensors,
nothing loaded or copied. Both sides only read them (the learner's gradients go to its LoRA
weights), so the engine may sample in one thread while the learner updates in another.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch


def frozen_base_tensors(policy: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The parameters and buffers of ``policy``'s base model (a peft model's, or the model
    itself) under the names a plain ``from_pretrained`` model gives them, LoRA's own left out;
    None when the base is trained too (no LoRA), so that it is not frozen."""
    get_base = getattr(policy, "get_base_model", None)
    base = get_base() if callable(get_base) else policy
    tensors: dict[str, torch.Tensor] = {}
    for name, param in base.named_parameters(remove_duplicate=False):
        if "lora_" in name:
            continue
        if param.requires_grad:
            return None
        tensors[name.replace(".base_layer.", ".")] = param.detach()
    for name, buffer in base.named_buffers(remove_duplicate=False):
        if "lora_" not in name:
            tensors[name.replace(".base_layer.", ".")] = buffer
    return tensors


def model_on_tensors(model: str, dtype: torch.dtype, tensors: Mapping[str, torch.Tensor]) -> Any:
    """``model``'s (a local folder's) causal LM with its parameters and buffers taken from
    ``tensors`` (:func:`frozen_base_tensors`) rather than loaded: built on the meta device,
    then each tensor put in place. Raises ValueError naming the first tensor that is missing
    or differs in shape or dtype (a learner whose weights are not ``model``'s in ``dtype``).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(config, dtype=dtype)
    slots = [(n, t, True) for n, t in net.named_parameters(remove_duplicate=False)]
    slots += [(n, t, False) for n, t in net.named_buffers(remove_duplicate=False)]
    for name, empty, is_param in slots:
        src = tensors.get(name)
        if src is None or src.shape != empty.shape or src.dtype != empty.dtype:
            found = "missing" if src is None else f"{tuple(src.shape)} {src.dtype}"
            raise ValueError(
                f"cannot share the learner's weights with the engine: {name} is {found}, the "
                f"engine needs {tuple(empty.shape)} {empty.dtype}"
            )
        owner_name, _, leaf = name.rpartition(".")
        owner = net.get_submodule(owner_name)
        if is_param:
            owner._parameters[leaf] = torch.nn.Parameter(src, requires_grad=False)
        else:
            owner._buffers[leaf] = src
    # from_config derived one from config.json; the folder's own wins, as from_pretrained's does
    with contextlib.suppress(OSError):  # the folder has no generation_config.json
        net.generation_config = GenerationConfig.from_pretrained(model)
    return net
