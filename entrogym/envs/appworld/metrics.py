"""Evaluation metrics as pure functions: AppWorld's TGC/SGC, accuracy and pass@k.

TGC and SGC follow ``appworld.evaluator.Metric._compute_metrics``: a task counts when all
its unit tests pass; TGC is the share of such tasks, SGC the share of scenarios whose tasks
all count. Values here are fractions in [0, 1] (AppWorld prints percentages).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any


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


def scenario_goal_completion(
    success: Mapping[str, bool], scenario_of: Callable[[str], str] = scenario_id
) -> float:
    """SGC: the share of scenarios all of whose tasks pass (AppWorld's min over a scenario).
    ``scenario_of`` maps a task id to its scenario (default: AppWorld's task ids)."""
    if not success:
        raise ValueError("scenario_goal_completion needs at least one task result")
    by_scenario: dict[str, list[bool]] = defaultdict(list)
    for task_id, ok in success.items():
        by_scenario[scenario_of(task_id)].append(bool(ok))
    return sum(all(v) for v in by_scenario.values()) / len(by_scenario)


def completion_by_sample(
    episodes: Sequence[Any],
    tasks: Sequence[str],
    samples: int,
    scenario_of: Callable[[str], str] = scenario_id,
) -> dict[str, Any]:
    """TGC and SGC per sample index (sample j of every task is one run of the whole split, as
    AppWorld runs it), averaged; episodes carry ``task_id`` and ``info["success"]``."""
    by_task: dict[str, list[bool]] = {t: [] for t in tasks}
    for e in episodes:
        by_task.setdefault(e.task_id, []).append(bool(e.info.get("success", False)))
    runs = []
    for j in range(samples):
        # a sample that never ran (its reset failed) counts as not completed
        runs.append({t: (v[j] if j < len(v) else False) for t, v in by_task.items()})
    tgc = [task_goal_completion(r) for r in runs]
    sgc = [scenario_goal_completion(r, scenario_of) for r in runs]
    return {"tgc": sum(tgc) / len(tgc), "sgc": sum(sgc) / len(sgc), "tgc_runs": tgc,
            "sgc_runs": sgc}  # fmt: skip


def completion_text(tgc: float, sgc: float) -> str:
    """TGC and SGC (fractions) as the printed summary shows them, in percent."""
    return f"TGC={100 * tgc:.1f}% SGC={100 * sgc:.1f}%"
