"""Top-level ``benchmarks/`` holds only what a make target or a test runs; one-off studies live
in ``benchmarks/studies/`` (its README lists each one's question and results entry).

A script counts as run when the Makefile names it (``benchmarks/NAME``), a test imports it or
names its file, or a script that counts as run imports it or names its file (``iteration.py``
starts ``bench_entrogym.py`` and ``bench_trl.py`` as processes by file name)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_SUFFIXES = {".py", ".sh"}


def named(source: str) -> set[str]:
    """The module names ``source`` (Python) imports and the string constants it holds: the
    ways a script or a test reaches a benchmark (``import roofline``, ``from
    benchmarks.demo_sweep import ...``, ``HERE / "bench_trl.py"``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
    return out


def reaches(names: set[str], script: Path) -> bool:
    """Whether ``names`` (from :func:`named`) import or name ``script``."""
    stem = script.stem
    return bool({script.name, stem, f"benchmarks.{stem}"} & names)


def unrun(benchmarks: Path, makefile: str, tests: list[str]) -> list[str]:
    """The top-level scripts in ``benchmarks`` that no make target, test or run script reaches."""
    scripts = sorted(p for p in benchmarks.iterdir() if p.suffix in SCRIPT_SUFFIXES)
    in_make = set(re.findall(r"benchmarks/([\w.]+)", makefile))
    test_names = set().union(*(named(t) for t in tests))
    run = {p for p in scripts if p.name in in_make or reaches(test_names, p)}
    grown = True
    while grown:  # what a run script imports or starts by name runs too
        names = set().union(*(named(p.read_text()) for p in run if p.suffix == ".py"))
        more = {p for p in scripts if p not in run and reaches(names, p)}
        run |= more
        grown = bool(more)
    return [p.name for p in scripts if p not in run]


def test_every_top_level_benchmark_is_run_by_a_make_target_or_a_test() -> None:
    tests = [p.read_text() for p in sorted((ROOT / "tests").rglob("*.py"))]
    left = unrun(ROOT / "benchmarks", (ROOT / "Makefile").read_text(), tests)
    assert left == [], (
        f"{left}: run them from a make target or a test, or move them to benchmarks/studies/"
    )


def test_every_study_is_listed_in_the_studies_readme() -> None:
    studies = ROOT / "benchmarks" / "studies"
    readme = (studies / "README.md").read_text()
    scripts = sorted(p.name for p in studies.iterdir() if p.suffix in SCRIPT_SUFFIXES)
    assert scripts
    assert [s for s in scripts if f"| `{s}` |" not in readme] == []


def test_an_unrun_script_is_reported(tmp_path: Path) -> None:
    for name, text in {
        "made.py": "import helper\n",
        "helper.py": "X = 1\n",
        "started.py": "",
        "tested.py": 'CMD = ["python", "started.py"]\n',
        "stray.py": "import helper\n",
        "notes.md": "",
    }.items():
        (tmp_path / name).write_text(text)
    makefile = "bench:\n\tpython benchmarks/made.py\n"
    tests = ["import sys\nfrom benchmarks.tested import CMD\n"]
    assert unrun(tmp_path, makefile, tests) == ["stray.py"]
    assert unrun(tmp_path, "", tests) == ["helper.py", "made.py", "stray.py"]
