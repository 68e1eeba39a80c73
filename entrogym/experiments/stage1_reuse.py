"""Whether a finished stage 1 (``entrogym sequential --stage1-from``) is this experiment's.

A stage-1 run is found by its folder's name, which is its label: a run of another spec under
the same label, one trained on another task A, with another model, lr, seed or number of
iterations would be reused under this experiment's name. So each run folder's ``config.yaml``
(what its trainer ran) is compared with the run this experiment would train, field by field as
``--resume`` compares a run (``entrogym.train.folder.safety``), the iterations too; evaluation,
logging and engine-location settings may differ. Any other difference is one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from entrogym.train.folder.layout import read_yaml
from entrogym.train.folder.safety import config_differences, refused_changes

# compared although a --resume may change them: a stage 1 of other length is another stage 1
ALSO_COMPARED = ("iterations",)


def _one_line(diffs: dict[str, list[Any]]) -> str:
    parts = []
    for key, (old, new) in diffs.items():
        if key == "algo":
            parts += [f"algo.{k} {a!r} -> {b!r}" for k, (a, b) in old.items()]
        else:
            parts.append(f"{key} {old!r} -> {new!r}")
    return "; ".join(parts)


def stage1_mismatch(folder: Path, planned: dict[str, Any]) -> str | None:
    """Why the run in ``folder`` is not the stage-1 run ``planned`` (a TrainConfig's
    ``to_dict()``), as ``field saved -> planned`` pairs; None when it is."""
    config_file = folder / "config.yaml"
    if not config_file.is_file():
        return f"{folder} has no config.yaml to compare with"
    try:
        saved = read_yaml(config_file)
    except Exception as exc:  # noqa: BLE001 - an unreadable file is refused, named
        return f"{config_file} cannot be read ({type(exc).__name__}: {exc})"
    if not isinstance(saved, dict):
        return f"{config_file} is not a mapping"
    diffs = config_differences(saved, planned)
    refused = refused_changes(diffs)
    refused.update({k: diffs[k] for k in ALSO_COMPARED if k in diffs})
    return _one_line(refused) if refused else None
