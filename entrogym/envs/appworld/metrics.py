"""Evaluation metrics as pure functions: AppWorld's TGC/SGC, accuracy and pass@k.

TGC and SGC follow ``appworld.evaluator.Metric._compute_metrics``: a task counts when all
its unit tests pass; TGC is the share of such tasks, SGC the share of scenarios whose tasks
all count. Values here are fractions in [0, 1] (AppWorld prints percentages).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping


def scenario_id(task_id: str) -> str:
    """AppWorld's scenario (generator) id of a task id ``<scenario>_<number>``."""
    task_id = task_id.split(":")[0]
    if task_id.count("_") != 1:
        raise ValueError(f"task_id {task_id!r} is not an AppWorld task id of the form SCENARIO_N")
    return task_id.split("_")[0]


def task_goal_completion(success: Mapping[str, bool]) -> float:
    """TGC: the share of tasks whose unit tests all pass."""
    if not success:
        raise ValueError("task_goal_completion needs at least one task result")
    return sum(bool(v) for v in success.values()) / len(success)


def scenario_goal_completion(success: Mapping[str, bool]) -> float:
    """SGC: the share of scenarios all of whose tasks pass (AppWorld's min over a scenario)."""
    if not success:
        raise ValueError("scenario_goal_completion needs at least one task result")
    by_scenario: dict[str, list[bool]] = defaultdict(list)
    for task_id, ok in success.items():
        by_scenario[scenario_id(task_id)].append(bool(ok))
    return sum(all(v) for v in by_scenario.values()) / len(by_scenario)
