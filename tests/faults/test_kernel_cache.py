"""Kernels that cannot crash a run: the static decoder's C++ kernels in the kernel cache.

A built ``.so`` is recorded with its size and sha256 and verified before it is loaded; a damaged
one (cut short as a full disk or a killed build leaves it, empty, overwritten) is rebuilt once,
with one line saying why, instead of a SIGBUS (a truncated ``.so`` crashed the process) or a
silent fallback that never rebuilt. Without a C++ compiler the fallback says "no C++ compiler
found" in one line, without torch's banner. A process that waits for another's build says so.

Each case loads the kernels in a child process (a crash must not take the tests down) from a
copy of the built kernel folder in its own ``ENTROGYM_CACHE``."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrogym.agents.engines import decode_kernel
from entrogym.models import default_cache_dir

REPO = Path(__file__).resolve().parents[2]
# Load the kernels and use one: "loaded" or "fallback" on stdout.
CHILD = (
    "import torch; from entrogym.agents.engines import decode_kernel as k; m = k.module(); "
    "print('fallback' if m is None else 'loaded'); "
    "x = torch.randn(3, 8); w = torch.ones(8); "
    "m is None or torch.testing.assert_close(k.rms_norm(x, w, 1e-6), "
    "torch.nn.functional.rms_norm(x, (8,), w, 1e-6))"
)


@pytest.fixture(scope="module")
def built() -> Path:
    """The kernel folder built on this machine for this checkout (built now if it is not)."""
    assert decode_kernel.module() is not None, "the decode kernels must build here"
    return default_cache_dir() / "kernels" / f"decode_kernels-{decode_kernel.build_key()}"


@pytest.fixture
def cache(built: Path, tmp_path: Path) -> Path:
    """A cache holding a copy of the built kernel folder (build outputs and their mtimes)."""
    root = tmp_path / "cache"
    shutil.copytree(built, root / "kernels" / built.name, symlinks=True)
    return root


def _so(cache: Path) -> Path:
    (found,) = (cache / "kernels").glob("decode_kernels-*/entrogym_decode_kernels_*.so")
    return found


def _child(cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "ENTROGYM_CACHE": str(cache), **env}
    return subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, cwd=REPO,
        env=environ,
    )  # fmt: skip


def _damage(so: Path, how: str) -> None:
    size = so.stat().st_size
    if how == "truncated":
        with open(so, "r+b") as fh:
            fh.truncate(size // 2)
    elif how == "empty":
        so.write_bytes(b"")
    else:  # overwritten with other bytes of the same size
        so.write_bytes(os.urandom(size))


def _lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_an_intact_kernel_loads_without_a_word(cache: Path) -> None:
    proc = _child(cache)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "loaded"
    assert _lines(proc.stderr) == []


@pytest.mark.parametrize("how", ["truncated", "empty", "overwritten"])
def test_a_damaged_kernel_is_rebuilt_once_in_one_line(cache: Path, how: str) -> None:
    so = _so(cache)
    _damage(so, how)
    proc = _child(cache)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)  # no SIGBUS (-7)
    assert proc.stdout.strip() == "loaded"
    lines = _lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "damaged" in lines[0] and "rebuil" in lines[0], lines[0]
    assert str(so.parent) in lines[0]
    again = _child(cache)  # rebuilt and recorded: the next process loads it quietly
    assert again.stdout.strip() == "loaded" and _lines(again.stderr) == [], again.stderr


def test_a_damaged_kernel_without_a_compiler_falls_back_in_one_line(cache: Path) -> None:
    _damage(_so(cache), "truncated")
    proc = _child(cache, CXX="/nonexistent/c++")
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stdout.strip() == "fallback"
    lines = _lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "damaged" in lines[0] and "no C++ compiler found" in lines[0], lines[0]


def test_no_compiler_is_said_in_those_words(tmp_path: Path) -> None:
    proc = _child(tmp_path / "empty-cache", CXX="/nonexistent/c++")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "fallback"
    lines = _lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "no C++ compiler found" in lines[0]
    assert "ninja" not in proc.stderr and "!!" not in proc.stderr


def test_a_process_waiting_for_another_build_says_so(cache: Path) -> None:
    folder = _so(cache).parent
    with open(folder / "entrogym.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process's build in progress
        environ = {**os.environ, "ENTROGYM_CACHE": str(cache)}
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=REPO, env=environ,
        )  # fmt: skip
        try:
            os.set_blocking(child.stderr.fileno(), False)
            said, deadline = b"", time.monotonic() + 60
            while b"waiting" not in said and time.monotonic() < deadline:
                try:
                    said += os.read(child.stderr.fileno(), 1 << 16)
                except BlockingIOError:
                    time.sleep(0.2)
            assert b"waiting" in said, said
            assert child.poll() is None  # it waits
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    out, rest = child.communicate(timeout=120)
    assert child.returncode == 0 and out.decode().strip() == "loaded", rest
    lines = _lines((said + rest).decode())
    assert len(lines) == 1 and str(folder) in lines[0], lines
