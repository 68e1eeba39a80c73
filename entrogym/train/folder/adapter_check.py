"""Verify an adapter before any model loads it (``eval --adapter``, ``train --init-adapter``).

In order: the folder (a checkpoint's adapter matches the sha256s of its ``meta.json``, as a
``--resume`` checks; any adapter entrogym wrote, a copy out of its checkpoint too, matches its
own ``entrogym_adapter.json``), the base model it was trained on (``meta.json`` and
``adapter_config.json``, compared by the models' own ``config.json``:
``entrogym.train.folder.model_identity``), its weights (a safetensors file of finite values), its
LoRA matrices against the model's layer shapes, and for ``--init-adapter`` the run's LoRA
settings. Each failure is one ValueError line that says what to do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from entrogym.train.folder.adapter_files import recorded_identity_mismatch
from entrogym.train.folder.checkpoint_verify import read_meta
from entrogym.train.folder.checkpoint_weights import (
    checkpoint_of,
    resolve_adapter,
    verified_copy,
    verified_meta,
)
from entrogym.train.folder.model_identity import base_model_mismatch


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
            "use another checkpoint's adapter (RUN/checkpoints/*/adapter)"
        ) from exc
    bad = [name for name, t in tensors.items() if not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(
            f"adapter file {str(weights)!r} holds weights that are not finite (NaN or inf in "
            f"{len(bad)} of {len(tensors)} tensors, e.g. {bad[0]}): the run that wrote it "
            "diverged; use an earlier checkpoint's adapter (RUN/checkpoints/*/adapter)"
        )


def _adapter_config(folder: Path, named: str) -> dict[str, Any]:
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise ValueError(
            f"{named} is not a LoRA adapter folder (no adapter_config.json); pass "
            "a folder written by save_pretrained, e.g. RUN/checkpoints/iter-N/adapter"
        )
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{named}: adapter_config.json is not JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{named}: adapter_config.json is not a JSON object")
    return config


def _check_base(named: str, base: str, model: str, served: bool, where: str) -> None:
    mismatch = base_model_mismatch(base, model, prepare=not served)
    if mismatch is None:
        return
    # Where only the names differ, the user may know better: let them say so in the file.
    same = "" if mismatch.certain else f", or if it is the same model, name it so in its {where}"
    raise ValueError(
        f"{named} was trained on base model {base!r}, not {model!r} {mismatch.why}; pass "
        f"--model {base} (the model it was trained on){same}"
    )


def check_lora_settings(
    folder: Path, config: dict[str, Any], source: str, lora: tuple[int, float, list[str]]
) -> None:
    """The adapter's rank, alpha and target modules are the run's ``lora``: only then does it
    load into the run's LoRA layers and mean there what it meant in its own run."""
    from entrogym.agents.engines.base import adapter_rank

    rank, alpha, targets = lora
    theirs = config.get("target_modules")
    settings = [
        ("LoRA rank", "--lora-rank", adapter_rank(folder) if "r" in config else None, rank),
        ("LoRA alpha", "--lora-alpha", config.get("lora_alpha"), alpha),
    ]
    if isinstance(theirs, list):  # a string is a regex: its layers are not listed
        settings.append(("LoRA target modules", "--lora-target-modules",
                         " ".join(sorted(theirs)), " ".join(sorted(targets))))  # fmt: skip
    for what, flag, got, want in settings:
        if got is not None and got != want:
            raise ValueError(
                f"init_adapter {source!r} has {what} {got}, but this run asks for {flag} "
                f"{want}; pass {flag} {got} to go on from it, or leave out --init-adapter to "
                "start a new adapter"
            )


def verify_adapter(
    source: str,
    model: str,
    *,
    option: str,
    served: bool = False,
    lora: tuple[int, float, list[str]] | None = None,
) -> Path:
    """The adapter folder ``source`` names, verified for ``model`` (``served``: a name on
    ``--engine-urls``, whose layers are not on this machine). ``option`` names the option in
    messages; ``init_adapter`` also takes a run or a checkpoint folder. ``lora``: the run's
    ``(rank, alpha, target modules)``, which the adapter's must equal. ValueError otherwise."""
    from entrogym.agents.engines.base import check_adapter
    from entrogym.models import resolve_model

    named = f"{option} {source!r}"
    if option == "init_adapter":  # verifies a checkpoint's sha256s
        folder = resolve_adapter(source, option)
        checkpoint = checkpoint_of(folder)
        meta = None if checkpoint is None else read_meta(checkpoint, checksums=False)
    else:
        folder = Path(source).expanduser()
        checkpoint = checkpoint_of(folder) if folder.is_dir() else None
        meta = None if checkpoint is None else verified_meta(checkpoint, named)
    config = _adapter_config(folder, named)
    if meta and meta.get("base_model"):
        _check_base(named, str(meta["base_model"]), model, served, "meta.json (base_model)")
    if config.get("base_model_name_or_path"):
        where = "adapter_config.json (base_model_name_or_path)"
        _check_base(named, str(config["base_model_name_or_path"]), model, served, where)
    differ = recorded_identity_mismatch(folder, model, prepare=not served)
    if differ:
        raise ValueError(
            f"{named} was trained on another base model than {model!r} ({differ}); pass the "
            "--model it was trained on"
        )
    check_adapter_weights(folder)  # first: the shape check reads the file's header
    verified_copy(folder, option)  # any other change since it was saved (its own record)
    if not served:
        check_adapter(folder, resolve_model(model))
    if lora is not None:
        check_lora_settings(folder, config, source, lora)
    return folder.resolve()
