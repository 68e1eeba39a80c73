"""Refuse an adapter trained on another base model before any engine loads it."""

from __future__ import annotations

import json
from pathlib import Path

# config.json fields that differ between models an adapter cannot move across
_IDENTITY = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")


def _identity(folder: Path) -> tuple | None:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return tuple(config.get(k) for k in _IDENTITY)


def _same_model(base: str, model: str, model_path: str | None) -> bool | None:
    """True / False when it can be told whether ``base`` is ``model``; None when it cannot (one
    side is a hub id, the other a folder)."""
    if base in (model, model_path):
        return True
    base_dir = Path(base).expanduser()
    model_dir = Path(model_path).expanduser() if model_path else None
    base_local, model_local = base_dir.is_dir(), bool(model_dir and model_dir.is_dir())
    if base_local and model_local:
        if base_dir.resolve() == model_dir.resolve():
            return True
        ids = _identity(base_dir), _identity(model_dir)
        return None if None in ids else ids[0] == ids[1]
    if not base_local and not model_local and not Path(base).is_absolute():
        return False  # two hub ids that differ
    return None


def check_adapter_weights(folder: Path) -> None:
    """The adapter's weights file reads as safetensors and every value is finite; otherwise a
    ValueError naming the file and what to do (an engine would fail on it deep in a traceback,
    or sample from NaN logits)."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        raise ValueError(f"adapter {str(folder)!r} has no adapter_model.safetensors")
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ValueError(
            f"adapter file {str(weights)!r} is not a safetensors file ({exc}): it is damaged; "
            "evaluate another checkpoint's adapter (RUN/checkpoints/*/adapter)"
        ) from exc
    bad = [name for name, t in tensors.items() if not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(
            f"adapter file {str(weights)!r} holds weights that are not finite (NaN or inf in "
            f"{len(bad)} of {len(tensors)} tensors, e.g. {bad[0]}): the run that wrote it "
            "diverged; evaluate an earlier checkpoint's adapter (RUN/checkpoints/*/adapter)"
        )


def check_adapter_base(adapter: str, model: str, model_path: str | None) -> str:
    """The adapter folder, checked to fit ``model`` (``model_path``: its resolved folder, None
    for a served model): ``adapter_config.json``'s base model must be that model, and its LoRA
    matrices must fit that model's layers (``check_adapter``). ValueError otherwise."""
    from entrogym.agents.engines import check_adapter

    folder = Path(adapter).expanduser()
    config_file = folder / "adapter_config.json"
    if not folder.is_dir() or not config_file.is_file():
        raise ValueError(
            f"adapter {adapter!r} is not a LoRA adapter folder (no adapter_config.json)"
        )
    try:
        base = json.loads(config_file.read_text()).get("base_model_name_or_path")
    except json.JSONDecodeError as exc:
        raise ValueError(f"adapter {adapter!r}: adapter_config.json is not JSON ({exc})") from exc
    if base and _same_model(str(base), model, model_path) is False:
        raise ValueError(
            f"adapter {adapter!r} was trained on base model {base!r}, not {model!r}; "
            "evaluate it with the model it was trained on"
        )
    check_adapter_weights(folder)
    return check_adapter(folder, model_path) if model_path else str(folder.resolve())
