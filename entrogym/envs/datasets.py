"""Problem sets: the shipped math datasets (``entrogym/envs/data/math/*.jsonl``) and user files.

A dataset file has one JSON object a line with ``id`` (str), ``problem`` (str) and ``answer``
(str or int); blank lines are skipped. A malformed line is reported by file and line number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

# name -> (file under data/math, the split its problems form)
SHIPPED: dict[str, tuple[str, str]] = {
    "aime_2024": ("aime_2024.jsonl", "test"),
    "aime_2025": ("aime_2025.jsonl", "test"),
    "amc_2023": ("amc_2023.jsonl", "test"),
    "aime_1983_2023": ("aime_1983_2023.jsonl", "train"),
}


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str


def parse_jsonl(text: str, source: str) -> tuple[Problem, ...]:
    """Problems of a JSON-lines text; ``source`` names the file in error messages."""
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}, line {lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg}); fix or remove the line") from e
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        missing = [k for k in ("id", "problem", "answer") if k not in row]
        if missing:
            raise ValueError(
                f"{where}: missing field(s) {missing}; each line needs id, problem, answer"
            )
        pid, text_, answer = row["id"], row["problem"], row["answer"]
        if not isinstance(pid, str) or not pid:
            raise ValueError(f"{where}: 'id' must be a non-empty string, got {pid!r}")
        if not isinstance(text_, str) or not text_.strip():
            raise ValueError(f"{where}: 'problem' must be a non-empty string")
        if isinstance(answer, bool) or not isinstance(answer, str | int) or str(answer) == "":
            raise ValueError(f"{where}: 'answer' must be a non-empty string or an integer")
        if pid in seen:
            raise ValueError(f"{where}: duplicate id {pid!r} (first on line {seen[pid]})")
        seen[pid] = lineno
        problems.append(Problem(id=pid, problem=text_, answer=str(answer)))
    return tuple(problems)


@cache
def _load_shipped(name: str) -> tuple[Problem, ...]:
    filename, _ = SHIPPED[name]
    resource = resources.files("entrogym.envs").joinpath("data", "math", filename)
    return parse_jsonl(resource.read_text(encoding="utf-8"), f"entrogym/envs/data/math/{filename}")


def load_problems(dataset: str | Path) -> tuple[Problem, ...]:
    """Problems of a shipped dataset (a key of :data:`SHIPPED`) or of a ``.jsonl`` file path."""
    if isinstance(dataset, str) and dataset in SHIPPED:
        return _load_shipped(dataset)
    path = Path(dataset)
    if path.suffix != ".jsonl" or not path.is_file():
        raise ValueError(
            f"dataset {str(dataset)!r} is neither a shipped dataset ({sorted(SHIPPED)}) "
            "nor an existing .jsonl file"
        )
    return parse_jsonl(path.read_text(encoding="utf-8"), str(path))


def default_split(dataset: str | Path) -> str:
    """The split a dataset's problems form: shipped ones as listed, user files ``train``."""
    if isinstance(dataset, str) and dataset in SHIPPED:
        return SHIPPED[dataset][1]
    return "train"
