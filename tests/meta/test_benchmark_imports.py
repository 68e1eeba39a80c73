"""benchmarks/ (and its studies/) reach the demo only through its public face: no module of
``entrogym.experiments`` is imported by path, every name taken from ``entrogym.experiments`` is
in its ``__all__``, and only the benchmarks that measure the demo itself, plus
``demo_workload.py`` (the demo's workload the others measure on), import it at all.

benchmarks/ is no package import-linter can see (its scripts import each other as top-level
modules), so this reads their import statements instead."""

from __future__ import annotations

import ast
from pathlib import Path

import entrogym.experiments

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# demo_workload.py: the one place the other benchmarks take the demo's workload from;
# entropy_hold.py and demo_sweep.py train the demo's own runs and check its goal.
MAY_IMPORT_THE_DEMO = {"demo_workload.py", "entropy_hold.py", "demo_sweep.py"}


def demo_imports(source: str) -> list[tuple[str, list[str]]]:
    """Every import of ``entrogym.experiments`` or a module under it in ``source``:
    (module, names)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [(node.module, [alias.name for alias in node.names])]
        elif isinstance(node, ast.Import):
            modules = [(alias.name, []) for alias in node.names]
        else:
            continue
        found += [
            (m, names) for m, names in modules if m.split(".")[:2] == ["entrogym", "experiments"]
        ]
    return found


def problems(name: str, source: str) -> list[str]:
    """What ``name`` (a benchmark's file name) does against the demo's public face."""
    out = []
    for module, names in demo_imports(source):
        if name not in MAY_IMPORT_THE_DEMO:
            out.append(f"{name} imports {module}: take the demo's workload from demo_workload.py")
        if module != "entrogym.experiments":
            out.append(f"{name} imports {module}: use the names entrogym.experiments exports")
        out += [f"{name} imports {n} from entrogym.experiments, not in its __all__"
                for n in names if n not in entrogym.experiments.__all__]  # fmt: skip
    return out


def test_benchmarks_use_only_the_demos_public_face() -> None:
    files = sorted(BENCHMARKS.rglob("*.py"))
    assert len(files) > 10
    found = [p for f in files for p in problems(f.name, f.read_text())]
    assert found == []
    importers = {f.name for f in files if demo_imports(f.read_text())}
    assert importers == MAY_IMPORT_THE_DEMO


def test_a_submodule_or_private_import_is_caught() -> None:
    source = (
        "from entrogym.experiments.config import TASKS\n"
        "def f():\n    from entrogym.experiments import _announce_demo, AGENT\n"
        "import entrogym.experiments.run\n"
    )
    assert problems("entropy_hold.py", source) == [
        "entropy_hold.py imports entrogym.experiments.config: use the names entrogym.experiments exports",
        "entropy_hold.py imports entrogym.experiments.run: use the names entrogym.experiments exports",
        "entropy_hold.py imports _announce_demo from entrogym.experiments, not in its __all__",
    ]
    assert problems("iteration.py", "from entrogym.experiments import AGENT\n") == [
        "iteration.py imports entrogym.experiments: take the demo's workload from demo_workload.py"
    ]
    assert problems("iteration.py", "from entrogym.experimentsx import x\nimport entrogym\n") == []
