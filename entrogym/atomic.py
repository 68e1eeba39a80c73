"""Atomic file and folder writes: a reader (or a run killed mid-write) sees old or new, never half.

Everything entrogym persists (checkpoints, metrics summaries, plots, prepared models, adapters)
goes through these helpers: write beside the target on the same filesystem, then rename.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """A rename is durable only once the directory holding it is synced."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, else it is removed.

    For writers that want a file name (``fig.savefig(tmp)``, ``torch.save(obj, tmp)``); the
    temporary keeps the target's suffix so format detection by extension still works.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}{path.suffix}")
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (fsynced)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def swap_in_folder(tmp: Path, final: Path, parked: Path | None = None) -> Path:
    """Move a fully written folder ``tmp`` to ``final``, replacing any previous one by renames.

    Between the two renames a reader may briefly find no folder, never a half-written one. The
    previous folder is parked at ``parked`` (default ``.NAME.old-PID`` beside it) until the new
    one is in place, then removed.
    """
    if final.exists():
        old = parked or final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(final.parent)
    return final
