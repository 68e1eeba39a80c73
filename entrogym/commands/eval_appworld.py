"""AppWorld's evaluation extras for ``entrogym eval`` (TGC/SGC, AppWorld's own report script).

LEAD: legacy path. The envs helper moves this into ``entrogym/envs/appworld/`` behind the env
hook ``evaluation_report(results, out_dir, **options) -> dict``; ``entrogym eval`` calls that
hook when the env has it and falls back to this module otherwise. Delete this module then.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

APPWORLD_ENTRY = "entrogym.envs.appworld.env:AppWorldEnv"
APPWORLD_MAX_TURNS = 50


def is_appworld(env_id: str) -> bool:
    """Whether ``env_id`` (already checked to be registered) is the AppWorld env class."""
    import gymnasium as gym

    return gym.spec(env_id.rpartition(":")[2]).entry_point == APPWORLD_ENTRY


def env_kwargs_for(cfg: Any, appworld: bool) -> dict[str, Any]:
    """The env's keyword arguments: ``--env-kwargs``, the split, and AppWorld's test rules
    (binary reward, 50 turns, the root)."""
    kwargs = dict(cfg.env_kwargs)
    if not appworld:
        if cfg.max_turns is not None or cfg.appworld_root is not None:
            raise ValueError(f"max_turns and appworld_root are for AppWorld envs, not {cfg.env!r}")
        return {**kwargs, "split": cfg.split} if cfg.split is not None else kwargs
    from entrogym.envs.appworld.runtime import check_root

    return {
        "split": cfg.split or "test_normal",
        "appworld_root": str(check_root(cfg.appworld_root)),
        "reward": "binary",
        "max_turns": cfg.max_turns or APPWORLD_MAX_TURNS,
        **kwargs,
    }


def appworld_metrics(episodes: list[Any], tasks: list[str], samples: int) -> dict[str, Any]:
    """TGC and SGC per sample index (sample j of every task is one AppWorld run), averaged."""
    from entrogym.envs.appworld.metrics import scenario_goal_completion, task_goal_completion

    by_task: dict[str, list[bool]] = {t: [] for t in tasks}
    for e in episodes:
        by_task[e.task_id].append(bool(e.info.get("success", False)))
    runs = []
    for j in range(samples):
        # a sample that never ran (its reset failed) counts as not completed
        runs.append({t: (v[j] if j < len(v) else False) for t, v in by_task.items()})
    tgc = [task_goal_completion(r) for r in runs]
    sgc = [scenario_goal_completion(r) for r in runs]
    return {
        "tgc": sum(tgc) / len(tgc),
        "sgc": sum(sgc) / len(sgc),
        "tgc_runs": tgc,
        "sgc_runs": sgc,
    }


# What ``appworld evaluate EXPERIMENT SPLIT`` does (appworld.evaluator.evaluate_dataset), for an
# explicit list of tasks: that command scores every task of the split and fails on a task that
# has no outputs, which a partial split (--max-tasks) or a failed reset leaves.
_REPORT_SCRIPT = """
import json, os, sys
import appworld
root, experiment, name, task_ids = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
appworld.update_root(root)
from appworld.common.path_store import path_store
from appworld.evaluator import Metric, evaluate_tasks, table_data_to_string
metrics = evaluate_tasks(task_ids=task_ids, experiment_name=experiment, suppress_errors=True,
                         include_details=True, save_reports=True)
folder = os.path.join(path_store.experiment_outputs, experiment, "evaluations")
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, name + ".json"), "w") as f:
    json.dump(metrics, f, indent=2)
table = table_data_to_string(Metric.build_report(metrics))
with open(os.path.join(folder, name + ".txt"), "w") as f:
    f.write(table)
print(table)
"""


def report_skip_reason(samples: int) -> str | None:
    """Why AppWorld's own report cannot run, or None: one experiment folder holds one output
    per task, so the K samples of a task would overwrite each other's outputs."""
    if samples > 1:
        return (
            f"--samples {samples}: AppWorld's report scores one output per task (use --samples 1)"
        )
    return None


def appworld_report(root: str, experiment: str, name: str, tasks: list[str]) -> dict[str, Any]:
    """AppWorld's own evaluator (``appworld.evaluator.evaluate_tasks``, as ``appworld
    evaluate`` runs it) on the kept outputs of ``tasks``; the report is saved as
    ``ROOT/experiments/outputs/EXPERIMENT/evaluations/NAME.json`` (and ``.txt``). Tasks without
    outputs (their episode never started) are left out and listed in ``missing_outputs``."""
    from entrogym.envs.appworld.runtime import appworld_python

    outputs = Path(root) / "experiments" / "outputs" / experiment
    present = [t for t in tasks if (outputs / "tasks" / t / "dbs").is_dir()]
    missing = [t for t in tasks if t not in present]
    if not present:
        return {
            "ok": None,
            "skipped": "no task left outputs to evaluate",
            "missing_outputs": missing,
        }
    try:
        proc = subprocess.run(
            [str(appworld_python()), "-c", _REPORT_SCRIPT, root, experiment, name, *present],
            capture_output=True, text=True, timeout=600, cwd=root,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "error": str(exc), "missing_outputs": missing}
    out: dict[str, Any] = {"ok": proc.returncode == 0, "returncode": proc.returncode}
    out["output"] = (proc.stdout + proc.stderr)[-4000:]
    out["tasks"], out["missing_outputs"] = len(present), missing
    report = outputs / "evaluations" / f"{name}.json"
    if proc.returncode == 0 and report.exists():
        out["report_path"] = str(report)
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            out["aggregate"] = json.loads(report.read_text()).get("aggregate")
    return out


def report_line(report: dict[str, Any]) -> str:
    """One line about AppWorld's own report for the printed summary."""
    if report.get("skipped"):
        return f"AppWorld report skipped: {report['skipped']}"
    if not report.get("ok"):
        tail = (report.get("error") or report.get("output") or "").strip().splitlines()[-1:]
        return f"AppWorld report failed: {tail[0] if tail else 'no output'}"
    agg = report.get("aggregate") or {}
    line = (
        f"AppWorld report: TGC={agg.get('task_goal_completion', float('nan')):.1f}% "
        f"SGC={agg.get('scenario_goal_completion', float('nan')):.1f}% over {report['tasks']} "
        f"tasks ({report.get('report_path')})"
    )
    if report.get("missing_outputs"):
        line += f"; no outputs for {len(report['missing_outputs'])} tasks"
    return line


def not_evaluated_line(summary: dict[str, Any]) -> str:
    """One line saying how many AppWorld episodes ended before the env scored their world."""
    return (
        f"note: {summary['not_evaluated']} of {summary['episodes']} episodes ended on an error "
        "before AppWorld evaluated them; TGC/SGC count "
        "them as not completed (AppWorld's own report, when it runs, scores their final world)"
    )
