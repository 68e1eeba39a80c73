"""Build (or reuse) the offline fixture world from the main virtualenv.

The builder itself (``fixture_builder.py`` + ``fixture_tasks.py``) runs in ``.venv-appworld``;
this module starts it as a subprocess and caches its output in a folder keyed by the hash of
the builder's files, so a test session builds it once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from entrogym.envs.appworld.runtime import appworld_python

HERE = Path(__file__).resolve().parent
BUILDER_FILES = ("fixture_builder.py", "fixture_tasks.py")


def builder_hash(venv: str | Path | None = None) -> str:
    h = hashlib.sha256()
    for name in BUILDER_FILES:
        h.update((HERE / name).read_bytes())
    h.update(str(appworld_python(venv).resolve()).encode())
    return h.hexdigest()[:16]


def build_fixture(
    directory: str | Path, venv: str | Path | None = None, timeout_s: float = 600
) -> dict:
    """Build the fixture world into ``directory`` (its ``data/`` is replaced); return the summary."""
    python = appworld_python(venv)
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [str(python), str(HERE / "fixture_builder.py"), str(directory)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        cwd=str(directory),
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"fixture build failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


def cached_fixture(cache_dir: str | Path | None = None, venv: str | Path | None = None) -> Path:
    """The fixture world's root in ``cache_dir`` (default ``$ENTROGYM_CACHE`` or
    ``~/.cache/entrogym``), built on first use; atomic: a half-built world is never visible."""
    cache = Path(cache_dir or os.environ.get("ENTROGYM_CACHE", Path.home() / ".cache" / "entrogym"))
    target = cache / f"appworld-fixture-{builder_hash(venv)}"
    if (target / "data" / "datasets" / "test_challenge.txt").exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".appworld-fixture-", dir=cache))
    try:
        build_fixture(tmp, venv)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race; its world is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists() and tmp != target:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
