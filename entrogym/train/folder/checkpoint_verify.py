"""Finding and verifying checkpoints: names, the file manifest of ``meta.json``, and the scan.

A checkpoint folder counts only if its ``meta.json`` says ``completed``, names the folder's
iteration, and every file it lists exists with the recorded size and sha256. Checkpoints
written before checksums existed list sizes only (``{"file": size}``) and are checked by
size. The scan goes newest first and skips (with a :class:`CheckpointWarning`) whatever fails,
so a damaged newest checkpoint falls back to the newest intact one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from entrogym.localserver import pid_alive

CHECKPOINTS_DIR = "checkpoints"
ADAPTER_DIR = "adapter"
STATE_FILE = "trainer_state.pt"
META_FILE = "meta.json"
PLAIN_WEIGHTS = "model.safetensors"
NAME_RE = re.compile(r"^iter-(\d{6,})$")
TMP_RE = re.compile(r"^(?:iter-\d{6,}|latest|best)\.(?:tmp|old)-(\d+)$")
_CHUNK = 1 << 20


class CheckpointWarning(UserWarning):
    """A checkpoint folder was skipped because it is incomplete or corrupt."""


def checkpoint_name(iteration: int) -> str:
    if iteration < 0:
        raise ValueError(f"iteration must be >= 0, got {iteration}")
    return f"iter-{iteration:06d}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def file_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size", "sha256"}}`` of every file but ``meta.json``."""
    return {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": sha256_of(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != META_FILE
    }


def _file_problem(folder: Path, rel: str, want: Any, checksums: bool) -> str | None:
    f = folder / rel
    if not f.is_file():
        return f"{rel} missing"
    size = want["size"] if isinstance(want, dict) else want  # old meta: the size alone
    if f.stat().st_size != size:
        return f"{rel} has {f.stat().st_size} bytes, expected {size} (truncated?)"
    if checksums and isinstance(want, dict) and sha256_of(f) != want.get("sha256"):
        return f"{rel} does not match its sha256 in {META_FILE} (corrupted on disk)"
    return None


def checkpoint_problem(path: Path, *, checksums: bool = True) -> str | None:
    """Why ``path`` is not a complete checkpoint, or None when it is one. ``checksums=False``
    checks sizes only (for listing; loading always verifies the checksums)."""
    if not path.is_dir():
        return "no such folder"
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{META_FILE} missing (save interrupted)"
    except (OSError, ValueError) as exc:
        return f"{META_FILE} unreadable ({exc})"
    if not isinstance(meta, dict) or meta.get("completed") is not True:
        return f"{META_FILE} does not say completed"
    m = NAME_RE.match(path.name)
    if m and int(m.group(1)) != meta.get("iteration"):
        return f"{META_FILE} says iteration {meta.get('iteration')}, folder says {int(m.group(1))}"
    for rel, want in meta.get("files", {}).items():
        problem = _file_problem(path, rel, want, checksums)
        if problem:
            return problem
    if not (path / STATE_FILE).is_file():
        return f"{STATE_FILE} missing"
    return None


def _warn_skipped(path: Path, problem: str) -> None:
    warnings.warn(f"ignoring checkpoint {path}: {problem}", CheckpointWarning, stacklevel=4)


def _named_folders(ckpt_dir: Path) -> list[tuple[int, Path]]:
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), e) for e in ckpt_dir.iterdir() if (m := NAME_RE.match(e.name))]
    return sorted(found)


def complete_folders(ckpt_dir: Path, *, checksums: bool = False) -> list[tuple[int, Path]]:
    """``(iteration, folder)`` of every complete checkpoint, oldest first; warns about the
    others."""
    found = []
    for it, path in _named_folders(ckpt_dir):
        problem = checkpoint_problem(path, checksums=checksums)
        if problem:
            _warn_skipped(path, problem)
        else:
            found.append((it, path))
    return found


def intact_checkpoints(run_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """The run's verified checkpoints, newest first; damaged ones are skipped with a
    :class:`CheckpointWarning`. Lazy: the checksums of older ones are computed only if the
    caller asks for the next one (e.g. when loading the newest fails)."""
    ckpt_dir = Path(run_dir) / CHECKPOINTS_DIR
    if ckpt_dir.is_dir():
        remove_stale_tmp(ckpt_dir)
    for _, path in reversed(_named_folders(ckpt_dir)):
        problem = checkpoint_problem(path)
        if problem:
            _warn_skipped(path, problem)
            continue
        yield path


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The newest intact checkpoint of a run, or None; damaged folders are skipped with a
    :class:`CheckpointWarning`."""
    return next(intact_checkpoints(run_dir), None)


def read_pointer(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def best_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The checkpoint marked with ``mark_best``, or None (warns if it is unusable)."""
    ckpt_dir = Path(run_dir) / CHECKPOINTS_DIR
    name = read_pointer(ckpt_dir / "best")
    if name is None:
        return None
    problem = checkpoint_problem(ckpt_dir / name)
    if problem:
        warnings.warn(
            f"ignoring best checkpoint {ckpt_dir / name}: {problem}",
            CheckpointWarning,
            stacklevel=2,
        )
        return None
    return ckpt_dir / name


def read_meta(path: str | os.PathLike[str], *, checksums: bool = True) -> dict[str, Any]:
    """``meta.json`` of a complete checkpoint; ValueError saying what is wrong otherwise."""
    path = Path(path)
    problem = checkpoint_problem(path, checksums=checksums)
    if problem:
        raise ValueError(f"{path} is not a complete checkpoint: {problem}")
    return json.loads((path / META_FILE).read_text(encoding="utf-8"))


def remove_stale_tmp(ckpt_dir: Path) -> None:
    """Drop the folders of saves that were killed (their process is gone): never read."""
    for entry in ckpt_dir.iterdir():
        m = TMP_RE.match(entry.name)
        if m and (int(m.group(1)) == os.getpid() or not pid_alive(int(m.group(1)))):
            final = ckpt_dir / entry.name.split(".")[0]
            if ".old-" in entry.name and entry.is_dir() and not final.exists():
                os.replace(entry, final)  # killed mid-swap of a re-saved iteration: put it back
            elif entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
