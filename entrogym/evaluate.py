"""``entrogym eval``: evaluate a policy on an env split and write ``OUT/eval.json``.

Rollouts and pass@1 / pass@k come from :func:`entrogym.train.evaluation.evaluate_policy`.
AppWorld splits also get AppWorld's metrics (TGC, SGC; :mod:`entrogym.envs.appworld.metrics`)
and, with one sample per task, AppWorld's own evaluator's report on the kept experiment outputs
(a whole split or its first ``--max-tasks`` tasks).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from jsonargparse import ActionConfigFile, ArgumentParser

from entrogym.atomic import atomic_write_text

ENGINES = ("vllm", "vllm-server", "hf")
DTYPES = ("fp32", "bf16")
APPWORLD_ENTRY = "entrogym.envs.appworld.env:AppWorldEnv"
APPWORLD_MAX_TURNS = 50


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="entrogym eval",
        description="Evaluate a policy on an env split: pass@1/pass@k; AppWorld TGC/SGC.",
    )
    p.add_argument("--config", action=ActionConfigFile, help="YAML file with any of the options")
    p.add_argument("--env", type=str, required=True, help="registered env id")
    p.add_argument("--split", type=str | None, default=None, help="default: the env's own split")
    p.add_argument("--model", type=str, required=True, help="built-in name, folder or hub id")
    p.add_argument("--adapter", type=str | None, default=None, help="LoRA adapter folder")
    p.add_argument("--engine", type=str, default="vllm", help=f"one of {list(ENGINES)}")
    p.add_argument("--urls", type=list[str] | None, default=None, help="vllm-server URLs")
    p.add_argument("--samples", type=int, default=1, help="samples per task (k of pass@k)")
    p.add_argument("--max-tasks", type=int | None, default=None, help="first N tasks only")
    p.add_argument("--out", type=str | None, default=None, help="folder for eval.json")
    p.add_argument("--engine-dtype", type=str, default="bf16", help=f"one of {list(DTYPES)}")
    p.add_argument("--max-response-tokens", type=int, default=1024, help="tokens per turn")
    p.add_argument("--max-context-tokens", type=int, default=4096, help="tokens per episode")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system-prompt", type=str | None, default=None)
    p.add_argument("--appworld-root", type=str | None, default=None, help="default $APPWORLD_ROOT")
    p.add_argument("--max-turns", type=int | None, default=None, help="AppWorld: default 50")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def is_appworld(env_id: str) -> bool:
    """Whether ``env_id`` is registered with the AppWorld env class (ValueError if unknown)."""
    import gymnasium as gym

    import entrogym  # noqa: F401  (registers the built-in ids)

    try:
        spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise ValueError(
            f"--env {env_id!r} is not a registered env ({exc}); built-in ids: "
            f"{', '.join(entrogym.envs.BUILTIN_ENV_IDS)}"
        ) from exc
    return spec.entry_point == APPWORLD_ENTRY


def check_options(ns: Any) -> None:
    """Reject bad values before any model is loaded; messages name the option."""
    if ns.engine not in ENGINES:
        raise ValueError(f"--engine must be one of {list(ENGINES)}, got {ns.engine!r}")
    if ns.engine_dtype not in DTYPES:
        raise ValueError(f"--engine-dtype must be one of {list(DTYPES)}, got {ns.engine_dtype!r}")
    for name in ("samples", "max_response_tokens", "max_context_tokens"):
        if getattr(ns, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(ns, name)}")
    for name in ("max_tasks", "max_turns"):
        if getattr(ns, name) is not None and getattr(ns, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(ns, name)}")
    if ns.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {ns.temperature}")
    if ns.max_response_tokens > ns.max_context_tokens:
        raise ValueError(
            f"--max-response-tokens ({ns.max_response_tokens}) exceeds --max-context-tokens "
            f"({ns.max_context_tokens}); raise the context or lower the response budget"
        )
    if ns.adapter is not None and not Path(ns.adapter).is_dir():
        raise ValueError(f"--adapter {ns.adapter!r} is not a folder (a saved LoRA adapter)")


def env_kwargs_for(ns: Any, appworld: bool) -> dict[str, Any]:
    if not appworld:
        if ns.max_turns is not None:
            raise ValueError(f"--max-turns is for AppWorld envs only, not {ns.env!r}")
        return {"split": ns.split} if ns.split is not None else {}
    from entrogym.envs.appworld.runtime import check_root

    root = str(check_root(ns.appworld_root))
    kwargs: dict[str, Any] = {
        "split": ns.split or "test_normal",
        "appworld_root": root,
        "reward": "binary",
        "max_turns": ns.max_turns or APPWORLD_MAX_TURNS,
    }
    return kwargs


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


def task_rows(per_task: list[dict], episodes: list[Any], appworld: bool) -> list[dict]:
    rows = []
    for row in per_task:
        row = dict(row)
        eps = [e for e in episodes if e.task_id == row["task_id"]]
        row["num_turns"] = [e.num_turns for e in eps]
        if appworld:
            row["passes"] = [e.info.get("passes") for e in eps]
            row["fails"] = [e.info.get("fails") for e in eps]
            row["num_tests"] = [e.info.get("num_tests") for e in eps]
            row["scenario_id"] = eps[0].info.get("scenario_id") if eps else None
            row["truncated_by"] = [e.info.get("truncated_by") for e in eps]
        rows.append(row)
    return rows


def write_json_atomic(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str))


def human_summary(summary: dict[str, Any]) -> str:
    k = summary["samples"]
    parts = [f"{summary['env']} [{summary['split']}] {summary['model']}:"]
    parts.append(f"tasks={summary['tasks']} samples={k} pass@1={summary['pass@1']:.4f}")
    if k > 1:
        parts.append(f"pass@{k}={summary[f'pass@{k}']:.4f}")
    if "tgc" in summary:
        parts.append(f"TGC={100 * summary['tgc']:.1f}% SGC={100 * summary['sgc']:.1f}%")
    parts.append(f"({summary['wall_s']:.1f} s)")
    return " ".join(parts)


def not_evaluated_line(summary: dict[str, Any]) -> str:
    """One line saying how many AppWorld episodes ended before the env scored their world."""
    return (
        f"note: {summary['not_evaluated']} of {summary['episodes']} episodes ended on an error "
        "before AppWorld evaluated them; TGC/SGC count "
        "them as not completed (AppWorld's own report, when it runs, scores their final world)"
    )


def prepare(ns: Any) -> dict[str, Any]:
    """Check the options and the env before any model is loaded (bad input: ValueError)."""
    from entrogym.envs.base import make_text_env, task_ids_of

    check_options(ns)
    appworld = is_appworld(ns.env)
    env_kwargs = env_kwargs_for(ns, appworld)
    env = make_text_env(ns.env, **env_kwargs)  # unknown split / bad data fail here, cheaply
    try:
        tasks = all_tasks = task_ids_of(env, ns.split)
        resolve = getattr(env.unwrapped, "resolve_split", None)
        split = resolve(ns.split) if resolve else ns.split
    finally:
        env.close()
    if ns.max_tasks is not None:
        tasks = tasks[: ns.max_tasks]
    if not ns.urls:
        from entrogym.models import resolve_model

        resolve_model(ns.model)  # an unknown name fails here, listing the built-ins
    experiment, skipped = None, None
    if appworld:
        # keep the outputs in one experiment folder for AppWorld's own report; without it the
        # env deletes them after each episode
        skipped = report_skip_reason(ns.samples)
        if skipped is None:
            experiment = f"entrogym-eval-{uuid.uuid4().hex[:8]}"
            env_kwargs["experiment_name"] = experiment
    report_name = split if len(tasks) == len(all_tasks) else f"{split}-first{len(tasks)}"
    return {"appworld": appworld, "experiment": experiment, "env_kwargs": env_kwargs,
            "tasks": tasks, "split": split, "report_name": report_name,
            "report_skipped": skipped}  # fmt: skip


def run_eval(ns: Any, prepared: dict[str, Any]) -> dict[str, Any]:
    from entrogym.agents.agent import LLMAgent
    from entrogym.agents.engines import make_engine
    from entrogym.train.evaluation import evaluate_policy

    appworld, experiment = prepared["appworld"], prepared["experiment"]
    env_kwargs, tasks = prepared["env_kwargs"], prepared["tasks"]
    t0 = time.perf_counter()
    engine = make_engine(
        ns.engine, ns.model, dtype=ns.engine_dtype, max_model_len=ns.max_context_tokens,
        urls=ns.urls, seed=ns.seed,
    )  # fmt: skip
    try:
        agent = LLMAgent.from_model(
            ns.model,
            system_prompt=ns.system_prompt,
            max_turn_tokens=ns.max_response_tokens,
            max_context=ns.max_context_tokens,
            # AppWorld: a cut turn still runs its code (the world is evaluated at the end)
            on_turn_budget="step" if appworld else "truncate",
        )
        result = evaluate_policy(
            engine, agent, ns.env, split=ns.split, samples=ns.samples, max_tasks=ns.max_tasks,
            adapter=ns.adapter, temperature=ns.temperature, seed=ns.seed, env_kwargs=env_kwargs,
        )  # fmt: skip
    finally:
        engine.close()
    summary: dict[str, Any] = {
        "env": ns.env,
        "split": prepared["split"],
        "model": ns.model,
        "adapter": ns.adapter,
        "engine": ns.engine,
        **result.summary,
        "episodes": len(result.episodes),
        "truncated": sum(bool(e.truncated) for e in result.episodes),
        "errors": sum("error" in e.info for e in result.episodes),
    }
    if appworld:
        summary.update(appworld_metrics(result.episodes, tasks, ns.samples))
        # an episode that ended on an error (a failed reset or step) was never scored by
        # /evaluate and counts as not completed in TGC/SGC
        summary["not_evaluated"] = sum(e.info.get("num_tests") is None for e in result.episodes)
        if experiment is not None:
            summary["experiment_name"] = experiment
            summary["appworld_report"] = appworld_report(
                env_kwargs["appworld_root"], experiment, prepared["report_name"], tasks
            )
        else:
            summary["appworld_report"] = {"ok": None, "skipped": prepared["report_skipped"]}
    summary["wall_s"] = time.perf_counter() - t0
    return {
        "summary": summary,
        "per_task": task_rows(result.per_task, result.episodes, appworld),
        "options": {k: v for k, v in ns.as_dict().items() if k != "config"},
    }


def cli(argv: list[str]) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        prepared = prepare(ns)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"entrogym eval: {exc}", file=sys.stderr)
        return 2
    report = run_eval(ns, prepared)
    if ns.out is not None:
        write_json_atomic(Path(ns.out) / "eval.json", report)
    if ns.json:
        print(json.dumps(report["summary"], indent=2, default=str))
    else:
        print(human_summary(report["summary"]))
        if "appworld_report" in report["summary"]:
            print(report_line(report["summary"]["appworld_report"]))
        if report["summary"].get("not_evaluated"):
            print(not_evaluated_line(report["summary"]))
        if ns.out is not None:
            print(f"wrote {Path(ns.out) / 'eval.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
