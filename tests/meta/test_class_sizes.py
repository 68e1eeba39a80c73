"""No class in entrogym/ runs past MAX_CLASS_LINES lines: a class that long holds more than one
concern (the sampler once held the engine, the adapters, the pipeline, evaluation, the target
probe and AEPO's samples; it was split by what each part owns)."""

from __future__ import annotations

import ast
from pathlib import Path

MAX_CLASS_LINES = 300
PACKAGE = Path(__file__).resolve().parents[2] / "entrogym"


def long_classes(root: Path, limit: int = MAX_CLASS_LINES) -> list[str]:
    """``path:Class (N lines)`` for every class under ``root`` longer than ``limit`` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root)}:{node.name} ({lines} lines)")
    return found


def test_no_class_is_over_the_limit() -> None:
    assert long_classes(PACKAGE) == []


def test_a_long_class_is_reported(tmp_path: Path) -> None:
    body = "".join(f"    def m{i}(self) -> int:\n        return {i}\n" for i in range(4))
    (tmp_path / "mod.py").write_text(f"class Short:\n    x = 1\n\n\nclass Long:\n{body}")
    assert long_classes(tmp_path, limit=8) == ["mod.py:Long (9 lines)"]
