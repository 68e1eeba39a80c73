"""The import-linter contracts in pyproject.toml hold: layers point one way, and the
algorithm core imports nothing from entrogym outside itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    assert "2 kept, 0 broken" in result.stdout


def test_a_violation_is_caught(tmp_path: Path) -> None:
    """The contract can fail: an algos module that imports the trainer breaks it."""
    config = (ROOT / "pyproject.toml").read_text()
    bad = tmp_path / "entrogym"
    subprocess.run(["cp", "-r", str(ROOT / "entrogym"), str(bad)], check=True)
    (bad / "algos" / "_leak.py").write_text("import entrogym.train.trainer  # noqa: F401\n")
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
    assert "entrogym.algos._leak -> entrogym.train" in result.stdout
