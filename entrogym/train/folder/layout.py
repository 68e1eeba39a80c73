"""What a run folder holds, and whether ``--out`` may be used as asked (read-only checks).

The files and folders of a run (``docs/runs.md``), how an entrogym run is recognised (its
marker, or the older layout), whether it has a checkpoint yet, and the refusals that come
before anything in the folder is touched: a folder that is not a run, a run that a fresh start
would overwrite, and a run file replaced by a folder (or a folder by a file).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from entrogym.train.folder.checkpoint_verify import CHECKPOINTS_DIR, NAME_RE
from entrogym.train.folder.metrics import METRICS_FILE, TB_DIR
from entrogym.yaml_limits import YamlTooLarge, safe_load

MARKER_FILE = "entrogym-run.json"
LOCK_FILE = ".lock"
CONFIG_FILE = "config.yaml"
HISTORY_FILE = "config_history.jsonl"
TOOL_ERRORS_FILE = "tool_errors.jsonl"  # tracebacks of the env tools that raised
ADAPTERS_DIR = "adapters"
# What a run that got going writes; a fresh run refuses a folder holding any of them (it would
# mix two runs). The marker and lock alone (a start that failed during setup) do not count.
RUN_FILES = (CONFIG_FILE, METRICS_FILE, CHECKPOINTS_DIR, ADAPTERS_DIR, TB_DIR)
# What each entry of a run must be when it exists: opening a folder as a file (or the other
# way round) fails deep inside a writer, after the model has loaded.
_FILES = (MARKER_FILE, LOCK_FILE, CONFIG_FILE, HISTORY_FILE, METRICS_FILE, TOOL_ERRORS_FILE)
_FOLDERS = (CHECKPOINTS_DIR, ADAPTERS_DIR, TB_DIR)


class RunFolderError(ValueError):
    """The run folder cannot be used as asked (not a run, another experiment, a file...)."""


def read_yaml(path: Path) -> Any:
    """The YAML in ``path``; None if there is no such file; RunFolderError if unreadable or
    refused by :func:`entrogym.yaml_limits.check_yaml`."""
    try:
        return safe_load(path.read_text(encoding="utf-8"), str(path))
    except FileNotFoundError:
        return None
    except YamlTooLarge as exc:
        raise RunFolderError(f"{exc}; restore the run's own config.yaml") from exc
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise RunFolderError(f"{path} is unreadable ({exc}); fix or restore it") from exc


def saved_config(run_dir: Path) -> dict[str, Any]:
    """The run's ``config.yaml`` ({} when absent or not a mapping); bounded YAML (yaml_limits)."""
    saved = read_yaml(run_dir / CONFIG_FILE)
    return saved if isinstance(saved, dict) else {}


# a folder named LABEL-sN is seed N of the configuration LABEL (entrogym compare, plot)
_SEED_SUFFIX = re.compile(r"^(?P<label>.+?)-s(?P<seed>\d+)$")


def folder_label(run_dir: Path) -> str:
    """The run's configuration label: its folder name without a ``-sN`` seed suffix."""
    match = _SEED_SUFFIX.match(run_dir.name)
    return match["label"] if match else run_dir.name


def label_and_seed(run_dir: Path) -> tuple[str, int | None]:
    """The run's configuration label (:func:`folder_label`) and its seed (``config.yaml``'s
    ``seed``, else the suffix's N, else None)."""
    match = _SEED_SUFFIX.match(run_dir.name)
    seed = int(match["seed"]) if match else None
    saved = saved_config(run_dir)
    if isinstance(saved.get("seed"), int):
        seed = saved["seed"]
    return folder_label(run_dir), seed


def is_entrogym_run(run_dir: str | os.PathLike[str]) -> bool:
    """True if ``run_dir`` was written by entrogym's trainer (marker, or the old layout)."""
    run_dir = Path(run_dir)
    if (run_dir / MARKER_FILE).is_file():
        return True
    try:
        config = read_yaml(run_dir / CONFIG_FILE)
    except RunFolderError:
        return False
    has_config = isinstance(config, dict) and {"env", "model", "algo"} <= config.keys()
    has_layout = (run_dir / CHECKPOINTS_DIR).is_dir() or (run_dir / ADAPTERS_DIR).is_dir()
    return has_config and has_layout


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint folder ``iter-NNNNNN`` (intact or not). The
    ``.tmp-PID`` folder of a save that was killed is not one: it never becomes a checkpoint."""
    folder = run_dir / CHECKPOINTS_DIR
    return folder.is_dir() and any(NAME_RE.match(p.name) for p in folder.iterdir())


def check_layout(run_dir: Path) -> None:
    """Refuse a run whose files are folders or whose folders are files."""
    for name in (*_FILES, *_FOLDERS):
        path = run_dir / name
        if path.exists() and path.is_dir() != (name in _FOLDERS):
            found, wanted = ("folder", "file") if path.is_dir() else ("file", "folder")
            raise RunFolderError(
                f"run folder {run_dir}: {name} is a {found}, not the {wanted} a run keeps "
                f"there; nothing was touched. Move it away (or restore the run's own {name}), "
                "then run the same command again."
            )


def check_usable(run_dir: Path, resume: bool) -> tuple[bool, bool]:
    """Refuse a folder we must not write. Returns (whether it holds a run, whether that run
    has no checkpoint yet: it failed before its first one and may start over)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"--out {run_dir} is a file; pass a folder for the run")
    entries = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    others = [name for name in entries if name not in (MARKER_FILE, LOCK_FILE)]
    ours = [name for name in entries if name in RUN_FILES]
    if others and not is_entrogym_run(run_dir):
        if resume:
            raise RunFolderError(
                f"--resume: {run_dir} is not an entrogym run folder (no {MARKER_FILE}, no "
                f"config.yaml with checkpoints/); it holds {', '.join(entries[:8])}. Nothing in "
                "it was touched; pass the folder of an entrogym run, or a new --out without "
                "--resume."
            )
        raise RunFolderError(
            f"--out {run_dir} is not empty and not an entrogym run (it holds "
            f"{', '.join(others[:8])}); nothing in it was touched. Pass a new or empty folder."
        )
    check_layout(run_dir)
    restart = bool(ours) and not has_checkpoint(run_dir)
    if ours and not resume and not restart:
        raise RunFolderError(
            f"run folder {run_dir} already holds a run ({', '.join(ours)}); pass --resume "
            "to continue it or --out NEW_DIR to start another"
        )
    return bool(ours), restart
