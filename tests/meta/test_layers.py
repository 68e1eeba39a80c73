"""The import-linter contracts in pyproject.toml hold: layers point one way (across entrogym
and inside entrogym.train), the algorithm core imports nothing from entrogym outside itself, and
no two sibling modules or packages import each other."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def lint_imports(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_contracts_are_kept() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert f"{len(contracts['contracts'])} kept, 0 broken" in result.stdout


CYCLE = "def f() -> None:\n    from entrogym.train.evaluation import {} as _  # noqa: F401\n"

VIOLATIONS = {
    "algos-imports-train": (
        {"algos/_leak.py": "import entrogym.train.trainer  # noqa: F401\n"},
        "entrogym.algos._leak -> entrogym.train",
    ),
    "part-imports-recipe": (
        {"train/learner/_leak.py": "import entrogym.train.trainer  # noqa: F401\n"},
        "entrogym.train.learner._leak -> entrogym.train.trainer",
    ),
    "function-level-cycle": (
        {
            "train/evaluation/_a.py": CYCLE.format("_b"),
            "train/evaluation/_b.py": CYCLE.format("_a"),
        },
        "No cycles are allowed in entrogym.train.evaluation.",
    ),
}


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_a_violation_is_caught(tmp_path: Path, case: str) -> None:
    """Each kind of contract can fail: planted modules that break it are reported."""
    planted, expected = VIOLATIONS[case]
    config = (ROOT / "pyproject.toml").read_text()
    bad = tmp_path / "entrogym"
    subprocess.run(["cp", "-r", str(ROOT / "entrogym"), str(bad)], check=True)
    for name, text in planted.items():
        (bad / name).write_text(text)
    (tmp_path / "pyproject.toml").write_text(config)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from importlinter.cli import lint_imports_command; "
        "sys.argv = sys.argv[:1]; lint_imports_command()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert expected in result.stdout, result.stdout[-3000:]
