"""``summary.json`` of the sequential experiment: per run and seed, stage 1 on A (entropy,
target, excursion, accuracy, pass@k) and stage 2 on B (reward curve, accuracy, its area and
second-half mean), with the experiment's settings and the held-out task counts it used."""

from __future__ import annotations

import time
from typing import Any


def stage_area(reward: list[float]) -> float:
    """The area under a stage-2 reward curve, per iteration: the trapezoid rule over iterations
    0..n-1 divided by n - 1 (the mean height; a single iteration is its own reward)."""
    if len(reward) == 1:
        return float(reward[0])
    inner = sum(reward[1:-1]) + (reward[0] + reward[-1]) / 2
    return inner / (len(reward) - 1)


def late_accuracy(curve: list[list[float]], iterations: int) -> float | None:
    """The mean held-out accuracy over a stage's second half: the evaluations after iterations
    ``(iterations - 1) / 2`` and on (``curve``: [iteration, accuracy] pairs, 0-based). Where a
    run ends, with less noise than its last evaluation when it is evaluated often
    (``--stage2-eval-every``): between iterations 20 and 30 one policy's held-out accuracy
    moved by up to +-0.12, more than the effect measured (docs/results.md). With only the
    first and last evaluations it is the last; None without evaluations."""
    late = [accuracy for it, accuracy in curve if 2 * it >= iterations - 1]
    return sum(late) / len(late) if late else None


def summarize(
    plan: Any, stage1: list[dict[str, Any]], results: list[dict[str, Any]], wall_s: float
) -> dict[str, Any]:
    """``summary.json`` of ``plan`` (an ``entrogym.experiments.sequential.Plan``): per run and seed,
    its stage-1 entropy, target, largest excursion, accuracy and pass@k on A, and its stage-2
    reward curve, accuracy and area on B."""
    from entrogym.experiments.report import tracking
    from entrogym.train.evaluation.target_tracking import filled_targets

    stage2 = {(r["label"], r["seed"]): r for r in results if r.get("stage") == 2}
    passes = {(r["label"], r["seed"]): r["pass_at_k"] for r in results if "pass_at_k" in r}
    runs = []
    for one in stage1:
        key, two = (one["label"], one["seed"]), stage2[(one["label"], one["seed"])]
        target = filled_targets(one["entropy_target"], one["entropy_tracked"])
        runs.append({
            "label": one["label"],
            "seed": one["seed"],
            "stage1": {
                # the entropy the controller tracked, in its target's terms (the plot's band)
                "entropy": one["entropy_tracked"],
                "entropy_sampled": one["entropy"],
                "entropy_target": target,
                "controlled": one["controlled"],
                "max_excursion": tracking(one)["max_excursion"],
                "reward": one["reward"],
                "accuracy": one["accuracy_after"],
                "pass_at_k": passes[key],
                "folder": one["folder"],
            },
            "stage2": {
                "reward": two["reward"],
                "entropy": two["entropy"],
                "accuracy_first": two["accuracy_first"],
                "accuracy": two["accuracy_after"],
                "accuracy_curve": two["accuracy_curve"],
                "accuracy_late": late_accuracy(two["accuracy_curve"], plan.stage2_iterations),
                "area": stage_area(two["reward"]),
                "folder": two["folder"],
            },
            "wall_s": one["wall_s"] + two["wall_s"],
        })  # fmt: skip
    return {
        "held": plan.runs[-1].label,
        **plan.record(),  # the pair, and the settings as asked
        "tasks_used": plan.tasks_used(),  # the held-out tasks each count could take
        "base": {"pass_at_k": passes.get(("base model", plan.seeds[0]))},
        "runs": runs,
        "wall_s": wall_s,
        # the day it finished: the demo's report shows the newest recorded result
        "date": time.strftime("%Y-%m-%d"),
    }
