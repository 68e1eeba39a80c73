"""benchmarks/ reach the demo only through its public face: no module of ``entrogym.demo`` is
imported by path, every name taken from ``entrogym.demo`` is in its ``__all__``, and only the
benchmarks that measure the demo itself, plus ``demo_workload.py`` (the demo's workload the
others measure on), import it at all.

benchmarks/ is no package import-linter can see (its scripts import each other as top-level
modules), so this reads their import statements instead."""

from __future__ import annotations

import ast
from pathlib import Path

import entrogym.demo

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# demo_workload.py: the one place the other benchmarks take the demo's workload from;
# entropy_hold.py and demo_sweep.py train the demo's own runs and check its goal.
MAY_IMPORT_THE_DEMO = {"demo_workload.py", "entropy_hold.py", "demo_sweep.py"}


def demo_imports(source: str) -> list[tuple[str, list[str]]]:
    """Every import of ``entrogym.demo`` or a module under it in ``source``: (module, names)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [(node.module, [alias.name for alias in node.names])]
        elif isinstance(node, ast.Import):
            modules = [(alias.name, []) for alias in node.names]
        else:
            continue
        found += [(m, names) for m, names in modules if m.split(".")[:2] == ["entrogym", "demo"]]
    return found


def problems(name: str, source: str) -> list[str]:
    """What ``name`` (a benchmark's file name) does against the demo's public face."""
    out = []
    for module, names in demo_imports(source):
        if name not in MAY_IMPORT_THE_DEMO:
            out.append(f"{name} imports {module}: take the demo's workload from demo_workload.py")
        if module != "entrogym.demo":
            out.append(f"{name} imports {module}: use the names entrogym.demo exports")
        out += [f"{name} imports {n} from entrogym.demo, not in its __all__"
                for n in names if n not in entrogym.demo.__all__]  # fmt: skip
    return out


def test_benchmarks_use_only_the_demos_public_face() -> None:
    files = sorted(BENCHMARKS.glob("*.py"))
    assert len(files) > 10
    found = [p for f in files for p in problems(f.name, f.read_text())]
    assert found == []
    importers = {f.name for f in files if demo_imports(f.read_text())}
    assert importers == MAY_IMPORT_THE_DEMO


def test_a_submodule_or_private_import_is_caught() -> None:
    source = (
        "from entrogym.demo.config import TASKS\n"
        "def f():\n    from entrogym.demo import _announce_demo, AGENT\n"
        "import entrogym.demo.run\n"
    )
    assert problems("entropy_hold.py", source) == [
        "entropy_hold.py imports entrogym.demo.config: use the names entrogym.demo exports",
        "entropy_hold.py imports entrogym.demo.run: use the names entrogym.demo exports",
        "entropy_hold.py imports _announce_demo from entrogym.demo, not in its __all__",
    ]
    assert problems("iteration.py", "from entrogym.demo import AGENT\n") == [
        "iteration.py imports entrogym.demo: take the demo's workload from demo_workload.py"
    ]
    assert problems("iteration.py", "from entrogym.demos import x\nimport entrogym\n") == []
