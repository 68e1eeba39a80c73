"""What makes an adapter folder safe to hand on: finite weights, and a record of its own.

Every adapter entrogym writes (``adapters/vNNNNNN`` for the engines, a checkpoint's
``adapter/``) goes through :func:`finite_adapter_weights` first: a version whose weights hold a
NaN or an inf is neither published nor checkpointed (the engines would sample from NaN logits,
a resume would train on from them).

Each also carries ``entrogym_adapter.json`` (:func:`write_adapter_record`): the size and
sha256 of its files and the base model's name and identity (its ``config.json`` fields that
shape the adapter). A copy shared without its checkpoint (whose ``meta.json`` holds checksums
too) is then verified wherever it goes (:func:`adapter_record_problem`). ``adapter_config.json``
is recorded without ``base_model_name_or_path``, the one field a user may correct by hand (an
adapter moved to a machine where its base model has another name).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from entrogym.train.folder.checkpoint_verify import sha256_of
from entrogym.train.folder.model_identity import IDENTITY, model_identity

RECORD = "entrogym_adapter.json"
ADAPTER_CONFIG = "adapter_config.json"
_EDITABLE = "base_model_name_or_path"


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


def _config_digest(folder: Path) -> str:
    """sha256 of ``adapter_config.json`` as JSON without ``base_model_name_or_path``."""
    config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    if isinstance(config, dict):
        config.pop(_EDITABLE, None)
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def write_adapter_record(folder: Path, base_model: str | None) -> None:
    """``folder/entrogym_adapter.json``, written into a folder that is not in place yet: the
    size and sha256 of every file of the adapter
    ``folder`` (``adapter_config.json`` by its JSON, less its base-model name) and the base
    model's name and identity (None where this machine has no ``config.json`` for it)."""
    files: dict[str, Any] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != RECORD):
        rel = str(path.relative_to(folder))
        if rel == ADAPTER_CONFIG:
            files[rel] = {"json_sha256": _config_digest(folder)}
        else:
            files[rel] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
    record = {
        "base_model": base_model,
        "base_model_identity": None if base_model is None else model_identity(base_model),
        "files": files,
    }
    # a plain write: the folder it goes into is swapped in whole (save_adapter, checkpoints)
    (folder / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def read_adapter_record(folder: Path) -> dict[str, Any] | None:
    """The adapter's record, or None for a folder without one (written elsewhere)."""
    path = folder / RECORD
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{RECORD} is not JSON ({exc})") from None
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        raise ValueError(f"{RECORD} lists no files")
    return record


def adapter_record_problem(folder: Path) -> str | None:
    """Why the adapter ``folder`` does not match its record, or None: it matches, or it has no
    record to check (an adapter written by another tool)."""
    try:
        record = read_adapter_record(folder)
    except ValueError as exc:
        return str(exc)
    if record is None:
        return None
    for rel, want in record["files"].items():
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing (listed in {RECORD})"
        if not isinstance(want, dict):
            return f"{RECORD} lists {rel} without its checksum"
        if "json_sha256" in want:
            try:
                same = _config_digest(folder) == want["json_sha256"]
            except (OSError, ValueError):
                same = False
            if not same:
                return f"{rel} differs from the one in {RECORD} (altered since it was saved)"
            continue
        if path.stat().st_size != want.get("size"):
            return (
                f"{rel} has {path.stat().st_size} bytes, {want.get('size')} in {RECORD} "
                "(truncated or altered)"
            )
        if sha256_of(path) != want.get("sha256"):
            return f"{rel} does not match its sha256 in {RECORD} (altered or damaged)"
    return None


def recorded_identity_mismatch(folder: Path, model: str, prepare: bool) -> str | None:
    """Where the base model's identity in the adapter's record differs from ``model``'s
    ``config.json``: a phrase naming the first field that differs; None when they agree or
    either side is unknown here."""
    record = read_adapter_record(folder)
    theirs = None if record is None else record.get("base_model_identity")
    if not isinstance(theirs, dict):
        return None
    ours = model_identity(model, prepare=prepare)
    if ours is None:
        return None
    differ = [k for k in IDENTITY if k in theirs and theirs[k] != ours[k]]
    if not differ:
        return None
    k = differ[0]
    return (
        f"{RECORD} records base model {record.get('base_model')!r} with {k} {theirs[k]!r}, "
        f"and {model!r} has {ours[k]!r}"
    )
