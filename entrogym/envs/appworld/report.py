"""AppWorld's evaluation report: TGC/SGC of an eval's episodes, and AppWorld's own evaluator.

The eval command reaches this through the optional evaluation hooks of the text-env contract
(:class:`entrogym.envs.contract.EvaluationHooks`), which
:class:`~entrogym.envs.appworld.env.AppWorldEnv` implements with the functions here; the
command reaches them with ``env.get_wrapper_attr(name)`` and needs no AppWorld-specific code:

- ``evaluation_env_kwargs(samples)``: env keyword arguments for the eval's rollouts (binary
  reward, 50 turns, and with one sample per task an experiment folder that keeps the outputs
  for AppWorld's own report); the command's own options win over them;
- ``evaluation_task_fields(task_id, episodes)``: the per-task columns (:func:`task_fields`);
- ``evaluation_report(results, out_dir, **options)``: the extra summary fields (see
  :func:`evaluation_report`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from entrogym.envs.appworld.metrics import completion_by_sample, completion_text, scenario_id
from entrogym.envs.appworld.runtime import appworld_python

EVAL_MAX_TURNS = 50  # AppWorld's evaluation budget
REPORT_TIMEOUT_S = 600.0


def evaluation_env_kwargs(samples: int) -> dict[str, Any]:
    """Env keyword arguments for an evaluation with ``samples`` samples per task."""
    kwargs: dict[str, Any] = {"reward": "binary", "max_turns": EVAL_MAX_TURNS}
    if report_skip_reason(samples) is None:
        # one experiment folder for the whole eval: the env keeps its outputs (it deletes the
        # per-episode folders otherwise), which AppWorld's own report reads
        kwargs["experiment_name"] = f"entrogym-eval-{uuid.uuid4().hex[:8]}"
    return kwargs


def appworld_metrics(episodes: Sequence[Any], tasks: Sequence[str], samples: int) -> dict:
    """TGC and SGC per sample index (sample j of every task is one AppWorld run), averaged."""
    return completion_by_sample(episodes, tasks, samples)


def task_fields(task_id: str, episodes: Sequence[Any]) -> dict[str, Any]:
    """The per-task columns of an AppWorld evaluation: ``passes``, ``fails`` and ``num_tests``
    (one entry per sample; None where AppWorld never scored the episode) and ``scenario_id``."""
    fields: dict[str, Any] = {
        key: [e.info.get(key) for e in episodes] for key in ("passes", "fails", "num_tests")
    }
    fields["scenario_id"] = scenario_id(task_id)
    return fields


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


def appworld_report(
    root: Path, experiment: str, name: str, tasks: Sequence[str], timeout_s: float
) -> dict[str, Any]:
    """AppWorld's own evaluator (``appworld.evaluator.evaluate_tasks``, as ``appworld
    evaluate`` runs it) on the kept outputs of ``tasks``; the report is saved as
    ``ROOT/experiments/outputs/EXPERIMENT/evaluations/NAME.json`` (and ``.txt``). Tasks without
    outputs (their episode never started) are left out and listed in ``missing_outputs``."""
    outputs = Path(root) / "experiments" / "outputs" / experiment
    present = [t for t in tasks if (outputs / "tasks" / t / "dbs").is_dir()]
    missing = [t for t in tasks if t not in present]
    if not present:
        return {"ok": None, "skipped": "no task left outputs to evaluate",
                "missing_outputs": missing}  # fmt: skip
    try:
        proc = subprocess.run(
            [str(appworld_python()), "-c", _REPORT_SCRIPT, str(root), experiment, name, *present],
            capture_output=True, text=True, timeout=timeout_s, cwd=str(root),
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


def not_evaluated_line(not_evaluated: int, episodes: int) -> str:
    """One line saying how many episodes ended before AppWorld evaluated their world."""
    return (
        f"note: {not_evaluated} of {episodes} episodes ended on an error before AppWorld "
        "evaluated them; TGC/SGC count them as not completed (AppWorld's own report, when it "
        "runs, scores their final world)"
    )


def shared_experiment(episodes: Sequence[Any]) -> str | None:
    """The one experiment folder all episodes wrote to (outputs kept), or None."""
    names = {e.info.get("experiment_name") for e in episodes if e.info.get("experiment_name")}
    return names.pop() if len(names) == 1 else None


def evaluation_report(
    root: Path,
    results: dict[str, Any],
    out_dir: Path | None,
    *,
    report_name: str | None = None,
    run_report: bool = True,
    timeout_s: float = REPORT_TIMEOUT_S,
) -> dict[str, Any]:
    """The extra summary fields of an AppWorld evaluation (see the env's hook of this name)."""
    episodes, tasks = list(results["episodes"]), list(results["tasks"])
    samples = int(results.get("samples", 1))
    fields: dict[str, Any] = appworld_metrics(episodes, tasks, samples)
    # an episode that ended on an error (a failed reset or step) was never scored by
    # AppWorld's evaluator and counts as not completed in TGC/SGC
    fields["not_evaluated"] = sum(e.info.get("num_tests") is None for e in episodes)
    experiment = shared_experiment(episodes) if samples == 1 else None
    skipped = report_skip_reason(samples)
    if skipped is None and experiment is None:
        skipped = "the episodes' outputs were not kept (make the env with experiment_name)"
    if skipped is None and not run_report:
        skipped = "not asked for (run_report=False)"
    if skipped is not None:
        report: dict[str, Any] = {"ok": None, "skipped": skipped}
    else:
        assert experiment is not None
        fields["experiment_name"] = experiment
        name = report_name or str(results.get("split") or "report")
        report = appworld_report(root, experiment, name, tasks, timeout_s)
        _copy_report(report, out_dir)
    fields["appworld_report"] = report
    fields["summary_text"] = completion_text(fields["tgc"], fields["sgc"])
    lines = [report_line(report)]
    if fields["not_evaluated"]:
        lines.append(not_evaluated_line(fields["not_evaluated"], len(episodes)))
    fields["report_lines"] = lines
    return fields


def _copy_report(report: dict[str, Any], out_dir: Path | None) -> None:
    """Put a copy of AppWorld's report files (``.json``, ``.txt``) into ``out_dir``."""
    source = report.get("report_path")
    if out_dir is None or not source:
        return
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    copies = []
    for suffix in (".json", ".txt"):
        path = Path(source).with_suffix(suffix)
        if path.exists():
            copies.append(str(shutil.copy2(path, Path(out_dir) / f"appworld-report{suffix}")))
    report["copies"] = copies
