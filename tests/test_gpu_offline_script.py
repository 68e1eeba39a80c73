"""benchmarks/gpu_offline.sh, the CUDA checks on a GPU machine with no package index: the wheels
it bundles are the versions this checkout's environments install, and a bad command is refused.
Runs on CPU (the script's GPU half is run on a GPU machine; docs/performance.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_offline.sh"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True)


def test_the_bundled_wheels_are_pinned_from_this_checkout():
    """`pins` reads each version from this `.venv` (so it fails when a bundled package is not
    installed here, renamed or dropped) and TRL's from `make bench`'s line in the Makefile (so it
    fails when that line changes shape); the packages the GPU tests import are among them."""
    result = run("pins")
    assert result.returncode == 0, result.stderr
    pins = dict(line.split("==") for line in result.stdout.split())
    assert {"transformers", "peft", "trl", "cut-cross-entropy", "gymnasium"} <= set(pins)
    assert all(version[0].isdigit() for version in pins.values()), pins


@pytest.mark.parametrize("args", [[], ["nonsense"]])
def test_a_bad_command_prints_the_usage_and_exits_2(args):
    result = run(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("usage:") and result.stderr.count("\n") == 1
