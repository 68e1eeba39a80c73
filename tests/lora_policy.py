"""LoRA policies for the learner's exactness tests: peft starts every B at 0, so an adapter is a
no-op until B gets values; these give it random ones so LoRA changes the outputs and both A and
B get gradients."""

from __future__ import annotations

import torch


def randomise_lora_b(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Fill every LoRA B matrix of ``model`` with N(0, 0.05^2) values drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    return model
