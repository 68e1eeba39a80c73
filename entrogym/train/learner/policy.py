"""The trainable policy: a Hugging Face causal LM with a ``peft`` LoRA adapter.

Defaults follow the paper's training appendix: LoRA rank 16, alpha 32 on q, k, v, o and the
MLP (gate, up, down); the LM head is not adapted, so the exact log-prob path
(:mod:`entrogym.train.learner.logprobs`) reads the base head weight. Adapters are saved and loaded in
``peft``'s standard format (``adapter_config.json`` + ``adapter_model.safetensors``), which
vLLM's LoRA support reads too.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from entrogym import onednn
from entrogym.atomic import swap_in_folder
from entrogym.models import LORA_TARGETS, resolve_model
from entrogym.train.devices.precision import check_device_dtype, resolve_dtype
from entrogym.train.folder.adapter_files import finite_adapter_weights, write_adapter_record


@dataclass
class LoraSettings:
    """LoRA hyperparameters (paper appendix "Training")."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = field(default_factory=lambda: LORA_TARGETS)

    def to_peft(self):
        from peft import LoraConfig

        if self.r < 1:
            raise ValueError(f"LoRA rank r must be >= 1, got {self.r}")
        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )


def load_base_model(
    model: str,
    *,
    dtype: str | torch.dtype = "fp32",
    device: str | torch.device = "cpu",
    cache_dir: str | None = None,
    head_dtype: str | torch.dtype | None = None,
) -> torch.nn.Module:
    """Load a built-in name, local folder or hub id with parameters in ``dtype`` on ``device``.

    ``head_dtype`` (default: ``dtype``): keep the LM head's weight in this dtype, copied from
    the checkpoint before the body is cast, and upcast the hidden states entering it. With
    ``dtype="bf16", head_dtype="fp32"`` the body runs in bf16 while the head and the
    log-probs are fp32 from fp32-upcast hidden states (paper appendix "Numerical
    considerations"; FSDP2's ``output_dtype=float32`` on GPU).
    """
    from transformers import AutoModelForCausalLM

    torch_dtype = resolve_dtype(dtype)
    head_torch_dtype = torch_dtype if head_dtype is None else resolve_dtype(head_dtype)
    device = check_device_dtype(device, torch_dtype)
    path = resolve_model(model, cache_dir)
    if head_torch_dtype == torch_dtype:
        net = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
        return net.to(device)
    net = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    head = net.get_output_embeddings()
    # A copy before the cast: the head keeps the checkpoint's values (not bf16-rounded ones),
    # and a tied embedding stays in the body's dtype.
    weight = head.weight.detach().to(head_torch_dtype, copy=True)
    requires_grad = head.weight.requires_grad
    net.to(torch_dtype)
    head.weight = torch.nn.Parameter(weight, requires_grad=requires_grad)
    net.config.tie_word_embeddings = False
    head.register_forward_pre_hook(_upcast_to_head)
    return net.to(device)


def _upcast_to_head(head: torch.nn.Module, args: tuple) -> tuple:
    return (args[0].to(head.weight.dtype), *args[1:])


def apply_lora(
    model: torch.nn.Module, settings: LoraSettings | None = None, seed: int | None = None
):
    """Wrap ``model`` with a fresh trainable LoRA adapter (B = 0, so outputs are unchanged)."""
    from peft import get_peft_model

    settings = settings or LoraSettings()
    missing_lora_targets(model, settings.target_modules)
    if seed is None:
        return get_peft_model(model, settings.to_peft())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, settings.to_peft())


def missing_lora_targets(model: torch.nn.Module, targets: tuple[str, ...] | list[str]) -> None:
    """ValueError, in one line naming them and the model's linear layers, unless every LoRA
    target module name is one of ``model``'s layers (a module ``model`` may be on the meta
    device: only the names are read)."""
    names = {name.split(".")[-1] for name, _ in model.named_modules()}
    missing = [t for t in targets if t not in names]
    if missing:
        linear = sorted({name.split(".")[-1] for name, m in model.named_modules()
                         if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"})  # fmt: skip
        raise ValueError(
            f"LoRA target module(s) {missing} do not exist in {type(model).__name__}; its "
            f"linear layers: {', '.join(linear)}; pass --lora-target-modules with some of them"
        )


def load_policy(
    model: str,
    *,
    dtype: str | torch.dtype = "fp32",
    device: str | torch.device = "cpu",
    lora: LoraSettings | None = None,
    adapter: str | os.PathLike | None = None,
    use_lora: bool = True,
    cache_dir: str | None = None,
    seed: int | None = None,
    head_dtype: str | torch.dtype | None = None,
) -> torch.nn.Module:
    """The policy to train: base model + a new LoRA adapter, or a saved one (``adapter``).

    ``use_lora=False`` trains all parameters of the base model instead. ``head_dtype``: see
    :func:`load_base_model`. The frozen base layers compute by oneDNN on CPU
    (:func:`entrogym.onednn.use_for_frozen_linears`), and each LoRA layer as one function
    (:func:`entrogym.train.learner.lora_kernel.use_fused_lora`).
    """
    base = load_base_model(
        model, dtype=dtype, device=device, cache_dir=cache_dir, head_dtype=head_dtype
    )
    if adapter is not None:
        policy = load_adapter(base, adapter, trainable=True)
    elif not use_lora:
        return base
    else:
        policy = apply_lora(base, lora, seed=seed)
    # the frozen base layers by oneDNN's kernel on CPU (MKL's sgemm can run at half of it)
    onednn.use_for_frozen_linears(policy)
    # and each adapted layer's base product and LoRA term in one function, not peft's 5 ops
    # (imported here: the module subclasses peft's layer, and peft takes seconds to import)
    from entrogym.train.learner.lora_kernel import use_fused_lora

    use_fused_lora(policy)
    return policy


def save_adapter(
    model: torch.nn.Module,
    path: str | os.PathLike,
    weights: dict[str, torch.Tensor] | None = None,
    base_model: str | None = None,
) -> Path:
    """Save the LoRA adapter in peft's format, atomically (temp folder, then rename), with its
    record (``entrogym_adapter.json``: its files' checksums and ``base_model``).

    ``weights``: the adapter's whole tensors when the model is FSDP2-sharded (gathered by
    ``entrogym.train.devices.distributed.gathered_adapter``); otherwise read from the model.
    Weights that are not finite are not written (``NonFiniteWeights``)."""
    if not hasattr(model, "peft_config"):
        raise ValueError("save_adapter needs a peft model (load_policy with LoRA)")
    final = Path(path)
    finite_adapter_weights(model, weights, f"adapter {final}")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True, state_dict=weights)
        write_adapter_record(tmp, base_model)
        tmp.chmod(0o755)
        swap_in_folder(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_adapter(base: torch.nn.Module, path: str | os.PathLike, trainable: bool = True):
    """Attach a saved peft adapter to ``base``."""
    from peft import PeftModel

    folder = Path(path)
    if not (folder / "adapter_config.json").is_file():
        raise ValueError(f"{folder} is not a peft adapter folder (no adapter_config.json)")
    return PeftModel.from_pretrained(base, str(folder), is_trainable=trainable)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
