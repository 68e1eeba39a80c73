"""The import-linter contracts in pyproject.toml hold: layers point one way (across entrogym
and inside entrogym.train), the algorithm core imports nothing from entrogym outside itself, and
no two sibling modules or packages import each other. Beyond the contracts, no module import
circle at all: import-linter's sibling contract does not see a package's ``__init__`` and a
module under it importing each other (``agents/engines/__init__`` <-> ``engines/hf.py`` once)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
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


def import_circles(package: str) -> list[list[str]]:
    """Every set of ``package``'s modules that import each other in a circle (function-level
    imports included, a package counted by its ``__init__``), each sorted: the strongly
    connected components of more than one module in grimp's import graph."""
    graph = grimp.build_graph(package, cache_dir=None)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []
    for root in sorted(graph.modules):  # Tarjan's algorithm, iterative (deep import chains)
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            module, imported = work[-1]
            step = next((m for m in imported if m in graph.modules), None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    work.append((step, iter(sorted(graph.find_modules_directly_imported_by(step)))))
                elif step in stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                members = stack[stack.index(module) :]
                del stack[stack.index(module) :]
                if len(members) > 1:
                    circles.append(sorted(members))
    return sorted(circles)


def test_no_module_import_circle() -> None:
    assert import_circles("entrogym") == []


def test_a_package_and_its_module_importing_each_other_is_caught(
    tmp_path: Path, monkeypatch
) -> None:
    pkg = tmp_path / "circled"
    (pkg / "engines").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "engines" / "__init__.py").write_text(
        "KINDS = ('hf',)\ndef make():\n    from circled.engines.hf import Engine\n"
    )
    (pkg / "engines" / "hf.py").write_text("from circled.engines import KINDS\nclass Engine: ...\n")
    (pkg / "engines" / "base.py").write_text("import circled.engines.hf  # noqa: F401\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_circles("circled") == [["circled.engines", "circled.engines.hf"]]
