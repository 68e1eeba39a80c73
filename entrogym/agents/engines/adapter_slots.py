"""A new adapter version's weights written into a loaded adapter's LoRA layers.

peft's ``load_adapter`` builds a fresh set of LoRA layers for every adapter it loads: it walks
the model, wraps each target module and initialises the new matrices at random, before it
copies the saved weights in. A training run publishes a new version of one adapter every
iteration, so the ``hf`` engine paid that for each. When the version it evicts has the same
config, the layers are already there, and copying the saved tensors into them
(``set_peft_model_state_dict``) took 0.03 s for SmolLM2's adapter. A call that switches to a
new version and prefills the demo's batch took 0.544 s the old way and 0.411 s this way in
fp32, 0.432 and 0.260 s in bf16 (``benchmarks/studies/adapter_switch.py``, docs/results.md).
"""

from __future__ import annotations

from typing import Any

import torch

# config fields that say nothing about the layers or the weights' values
_IGNORED = {"base_model_name_or_path", "revision", "inference_mode"}


def _layers_of(config: Any) -> dict[str, Any]:
    return {k: v for k, v in config.to_dict().items() if k not in _IGNORED}


def load_into_slot(model: Any, adapter: str, slot: str, device: torch.device) -> bool:
    """Copy the adapter saved in folder ``adapter`` into ``model``'s loaded adapter ``slot``
    (a peft model), where both have the same LoRA config; False (nothing changed) otherwise,
    and the caller loads it as a new adapter."""
    from peft import PeftConfig
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    if _layers_of(PeftConfig.from_pretrained(adapter)) != _layers_of(model.peft_config[slot]):
        return False
    weights = load_peft_weights(adapter, device=str(device))
    # every tensor of the slot must come from the saved adapter, and nothing else: compared
    # before anything is copied, so a mismatch leaves the slot as it was
    own = {name.replace(f".{slot}.", ".") for name, _ in model.named_parameters()
           if f".{slot}." in name}  # fmt: skip
    if own != set(weights):
        return False
    result = set_peft_model_state_dict(model, weights, adapter_name=slot)
    return not result.unexpected_keys
