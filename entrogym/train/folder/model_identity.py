"""Whether the base model an adapter or a checkpoint names is the model of this run.

An adapter names its base model by a string: ``adapter_config.json`` a folder or a hub id, a
checkpoint's ``meta.json`` the ``--model`` of its run (a built-in name, a folder, a hub id).
One model has many such names (a built-in and its cache folder, a hub id and a downloaded copy,
the same folder on two machines), and one folder name may hold another model. So the two are
compared by what their ``config.json`` says about the architecture (:data:`IDENTITY`), read
from disk without loading weights or downloading anything. Only where one side has no
``config.json`` on this machine (a hub id not in the local Hugging Face cache, a folder of
another machine) do the names decide, and then they must match.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NamedTuple

from entrogym.models import BUILTIN_MODELS, built_model, prepare_model

# config.json fields an adapter cannot move across: its matrices are shaped by them
IDENTITY = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _is_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and not Path(name).expanduser().exists()


def _config_file(name: str, *, prepare: bool) -> Path | None:
    """``config.json`` of the model ``name`` on this machine, or None: a folder, a built-in
    (built first with ``prepare``), or a hub id already in the local Hugging Face cache."""
    if name in BUILTIN_MODELS:
        folder = Path(prepare_model(name)) if prepare else built_model(name)
        return None if folder is None else folder / "config.json"
    folder = Path(name).expanduser()
    if folder.is_dir():
        return folder / "config.json" if (folder / "config.json").is_file() else None
    if _is_hub_id(name):
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(name, "config.json")
        except ValueError:  # not a valid repo id after all (HFValidationError)
            return None
        return Path(cached) if isinstance(cached, str) else None
    return None


def model_identity(name: str, *, prepare: bool = False) -> dict[str, Any] | None:
    """The :data:`IDENTITY` fields of model ``name``'s ``config.json`` (a multimodal model's
    text config), or None when this machine has no readable ``config.json`` for it."""
    config_file = _config_file(name, prepare=prepare)
    if config_file is None:
        return None
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    return {k: text.get(k, config.get(k)) for k in IDENTITY}


def _short_name(name: str) -> str:
    return Path(name.rstrip("/")).name.casefold()


def _names_match(a: str, b: str) -> bool:
    """The same name: equal hub ids, or one side a path whose last part is the other's
    (``/models/Qwen3-4B`` for ``Qwen/Qwen3-4B``, another machine's cache of a built-in)."""
    if _is_hub_id(a) and _is_hub_id(b):
        return a.casefold() == b.casefold()
    return _short_name(a) == _short_name(b)


class Mismatch(NamedTuple):
    """Why two names are not known to be one model: ``why`` is a phrase in parentheses;
    ``certain`` when their config.json differ (not merely their names)."""

    why: str
    certain: bool


def base_model_mismatch(base: str, model: str, *, prepare: bool = True) -> Mismatch | None:
    """None when ``base`` (what an adapter or checkpoint names) is ``model`` (this run's
    ``--model``), else why not. ``prepare``: build a built-in ``model`` to read its config
    (False for a served model, whose name may only look like one)."""
    if base == model:
        return None
    base_dir, model_dir = Path(base).expanduser(), Path(model).expanduser()
    if base_dir.is_dir() and model_dir.is_dir() and base_dir.resolve() == model_dir.resolve():
        return None
    if base in BUILTIN_MODELS and model in BUILTIN_MODELS:  # distinct models by construction
        return Mismatch("(two different built-in models)", True)
    # Their side first: without it only the names can tell, and ours need not be built.
    theirs = model_identity(base)
    ours = None if theirs is None else model_identity(model, prepare=prepare)
    if ours is not None and theirs is not None:
        differ = [k for k in IDENTITY if ours[k] != theirs[k]]
        if not differ:
            return None
        k = differ[0]
        return Mismatch(f"(their config.json differ: {k} {theirs[k]!r} vs {ours[k]!r})", True)
    if _names_match(base, model):
        return None
    missing = base if theirs is None else model
    why = f"({missing!r} has no config.json on this machine to compare, and the names differ)"
    return Mismatch(why, False)
