"""Adapter weights in and out of checkpoints, and ``--init-adapter`` sources.

A checkpoint's ``adapter/`` is plain peft format (``save_pretrained``), or
``model.safetensors`` for a plain ``torch.nn.Module``; a checkpoint records its base model
and loading it into another one is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from entrogym.train.folder.adapter_files import adapter_record_problem, write_adapter_record
from entrogym.train.folder.checkpoint_verify import (
    ADAPTER_DIR,
    CHECKPOINTS_DIR,
    META_FILE,
    NAME_RE,
    PLAIN_WEIGHTS,
    best_checkpoint,
    checkpoint_problem,
    latest_checkpoint,
    read_meta,
)
from entrogym.train.folder.layout import is_entrogym_run
from entrogym.train.folder.model_identity import base_model_mismatch

_SOURCES = (
    "pass a run folder, a checkpoint folder (RUN/checkpoints/iter-N) or a peft adapter folder"
)


def _is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "save_pretrained")


def save_weights(
    model: torch.nn.Module,
    folder: Path,
    weights: dict[str, torch.Tensor] | None,
    base_model: str | None = None,
) -> None:
    """``folder/adapter``: peft format, or ``model.safetensors`` for a plain module, with its
    record (``entrogym_adapter.json``), so that a copy of it alone can be verified."""
    if _is_peft(model):
        model.save_pretrained(str(folder / ADAPTER_DIR), state_dict=weights)
    else:
        from safetensors.torch import save_file

        (folder / ADAPTER_DIR).mkdir()
        source = model.state_dict() if weights is None else weights
        tensors = {k: v.detach().cpu().contiguous().clone() for k, v in source.items()}
        save_file(tensors, str(folder / ADAPTER_DIR / PLAIN_WEIGHTS))
    write_adapter_record(folder / ADAPTER_DIR, base_model)


def load_weights(model: torch.nn.Module, adapter_dir: Path, *, what: str) -> None:
    if _is_peft(model):
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        if not (adapter_dir / "adapter_config.json").is_file():
            raise ValueError(f"{what}: {adapter_dir} holds no peft adapter (adapter_config.json)")
        weights = load_peft_weights(str(adapter_dir), device="cpu")
        try:
            result = set_peft_model_state_dict(model, weights)
        except RuntimeError as exc:  # size mismatch: another rank or another base model
            # torch lists every mismatched tensor on a line of its own: one says enough
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            sizes = [line for line in lines if line.startswith("size mismatch")]
            shown = f"{sizes[0]} and {len(sizes) - 1} more" if sizes else lines[0]
            raise ValueError(
                f"{what}: the adapter in {adapter_dir} does not fit this model ({shown}). "
                "Use an adapter trained on the same base model with the same LoRA settings."
            ) from exc
        missing = [k for k in result.missing_keys if "lora_" in k]
        if result.unexpected_keys or missing:
            raise ValueError(
                f"{what}: the adapter in {adapter_dir} does not match this model's LoRA layers "
                f"(unexpected: {list(result.unexpected_keys)[:5]}, missing: {missing[:5]}). "
                "Use the same LoRA rank and target modules as the run that saved it."
            )
        return
    from safetensors.torch import load_file

    weights_file = adapter_dir / PLAIN_WEIGHTS
    if not weights_file.is_file():
        raise ValueError(f"{what}: {adapter_dir} has no {PLAIN_WEIGHTS} for a plain torch module")
    model.load_state_dict(load_file(str(weights_file)))


def check_base_model(meta: dict[str, Any], base_model: str | None, path: Path) -> None:
    """The checkpoint at ``path`` (its ``meta``) was trained on ``base_model``, told by the
    models' own ``config.json`` (``entrogym.train.folder.model_identity``); ValueError otherwise."""
    saved = meta.get("base_model")
    if base_model is None or saved is None:
        return
    mismatch = base_model_mismatch(str(saved), base_model)
    if mismatch is not None:
        raise ValueError(
            f"checkpoint {path} was trained on base model {saved!r}, not {base_model!r} "
            f"{mismatch.why}. "
            "Pass the same --model as the run that saved it, or start from the base model "
            "without this checkpoint."
        )


def checkpoint_of(adapter: Path) -> Path | None:
    """The checkpoint folder ``adapter`` belongs to (``RUN/checkpoints/iter-N/adapter``), or
    None for an adapter folder of its own."""
    parent = adapter.parent
    if adapter.name == ADAPTER_DIR and (
        (parent / META_FILE).exists() or NAME_RE.match(parent.name)
    ):
        return parent
    return None


def verified_meta(checkpoint: Path, option: str) -> dict[str, Any]:
    """``meta.json`` of ``checkpoint``, after every file matched its size and sha256 there
    (as ``--resume`` checks); one ValueError line saying what to do otherwise."""
    problem = checkpoint_problem(checkpoint)
    if problem:
        raise ValueError(
            f"{option}: checkpoint {checkpoint} is damaged: {problem}; use another checkpoint "
            f"of that run ({checkpoint.parent}/iter-*)"
        )
    return read_meta(checkpoint, checksums=False)  # verified just above


def verified_copy(adapter: Path, option: str) -> None:
    """The adapter folder matches its own record (``entrogym_adapter.json``), wherever it was
    copied; one ValueError line saying what to do otherwise."""
    problem = adapter_record_problem(adapter)
    if problem:
        raise ValueError(
            f"{option} {str(adapter)!r}: {problem}; use an intact copy of the adapter (its "
            "run keeps one in RUN/checkpoints/iter-N/adapter)"
        )


def resolve_adapter(source: str | os.PathLike[str], option: str = "init_adapter") -> Path:
    """The adapter folder meant by ``source``: a checkpoint folder, a run folder (its best
    checkpoint, else its latest) or a plain peft adapter folder. A checkpoint's adapter (also
    one named by its own folder, ``.../iter-N/adapter``) is verified against its sha256s."""
    src = Path(source).expanduser()
    if not src.exists():
        raise ValueError(f"{option}: {src} does not exist; {_SOURCES}")
    if not src.is_dir():
        raise ValueError(f"{option}: {src} is a file, not a folder; {_SOURCES}")
    if (src / CHECKPOINTS_DIR).is_dir() or is_entrogym_run(src):
        found = best_checkpoint(src) or latest_checkpoint(src)
        if found is None:
            raise ValueError(
                f"{option}: {src} is a run folder with no complete checkpoint yet (a run "
                "writes one every --checkpoint-every iterations and when it ends); pass it once "
                f"its run has written one (`entrogym train --resume --out {src}` continues that "
                "run), or pass a checkpoint or peft adapter folder"
            )
        src = found
    if (src / META_FILE).exists() or NAME_RE.match(src.name):
        verified_meta(src, option)
        return src / ADAPTER_DIR
    if (src / "adapter_config.json").is_file() or (src / PLAIN_WEIGHTS).is_file():
        checkpoint = checkpoint_of(src)
        if checkpoint is not None:
            verified_meta(checkpoint, option)
        return src
    raise ValueError(
        f"{option}: {src} is neither a run folder, a checkpoint folder nor a peft adapter "
        "folder (adapter_config.json)"
    )


def load_adapter_into(
    model: torch.nn.Module,
    adapter_dir_or_checkpoint: str | os.PathLike[str],
    *,
    base_model: str | None = None,
) -> Path:
    """Load adapter weights only (no optimizer, RNG or counters) for ``--init-adapter``:
    the paper's sequential training starts a new run from another run's best checkpoint.
    Returns the adapter folder used."""
    adapter = resolve_adapter(adapter_dir_or_checkpoint)
    verified_copy(adapter, "init_adapter")  # a copy out of its checkpoint, by its own record
    checkpoint = checkpoint_of(adapter)
    if checkpoint is not None:
        check_base_model(read_meta(checkpoint, checksums=False), base_model, checkpoint)
    load_weights(model, adapter, what=f"--init-adapter {adapter_dir_or_checkpoint}")
    return adapter
