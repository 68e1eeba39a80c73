"""``entrogym eval``: evaluate a policy on an env split and write ``OUT/eval.json``.

Rollouts and pass@1 / pass@k come from :func:`entrogym.train.evaluation.evaluate_policy`; the
default split is the env's held-out one (never train). An env may add its own summary fields
through the hook ``evaluation_report(results, out_dir, **options) -> dict`` (AppWorld: TGC, SGC
and AppWorld's own report); until that hook lands, AppWorld's extras come from
:mod:`entrogym.commands.eval_appworld`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from entrogym.agents.config import AgentConfig
from entrogym.atomic import atomic_write_text
from entrogym.commands import eval_appworld as legacy
from entrogym.commands.adapters import check_adapter_base
from entrogym.commands.options import make_parser, parse_options, run_command
from entrogym.commands.preflight import check_cache, check_env_id, check_model, check_writable_dir

PROG = "entrogym eval"
HOOK = "evaluation_report"


@dataclass
class EvalConfig(AgentConfig):
    """What to evaluate (the rollout options, model to system_prompt, are shared with train).

    Args:
        env: env id to evaluate on (``module:id`` imports ``module`` first, as for train).
        env_kwargs: keyword arguments for ``gymnasium.make(env, **env_kwargs)``.
        split: split to evaluate (None = the env's held-out split: its eval_split, else test).
        adapter: LoRA adapter folder (refused if it was trained on another base model).
        urls: base URLs of running ``vllm serve`` instances (the same as engine_urls).
        samples: samples per task (k of pass@k).
        max_tasks: evaluate the first N tasks of the split only.
        out: folder for eval.json (None = print only).
        seed: seed of the rollouts.
        appworld_root: AppWorld data root (default $APPWORLD_ROOT).
        max_turns: AppWorld: actions per episode (default 50).
        json: print the summary as JSON.
        max_response_tokens: per-turn generation budget.
        on_turn_budget: a turn that hits max_response_tokens (None = the env's rule: AppWorld
            steps on with the cut text, other envs end the episode).
    """

    env: str = ""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    split: str | None = None
    adapter: str | None = None
    urls: list[str] = field(default_factory=list)
    samples: int = 1
    max_tasks: int | None = None
    out: str | None = None
    seed: int = 0
    appworld_root: str | None = None
    max_turns: int | None = None
    json: bool = False
    max_response_tokens: int = 1024
    on_turn_budget: Literal["truncate", "step"] | None = None

    def __post_init__(self) -> None:
        if self.urls:
            if self.engine_urls and list(self.engine_urls) != list(self.urls):
                raise ValueError("pass the server URLs once: --urls or --engine-urls, not both")
            self.engine_urls = list(self.urls)
        super().__post_init__()
        if not self.env:
            raise ValueError("env is required: pass --env ID (e.g. entrogym/AIME-v0)")
        if self.samples < 1:
            raise ValueError(f"samples (--samples) must be >= 1, got {self.samples}")
        for name in ("max_tasks", "max_turns"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} (--{name.replace('_', '-')}) must be >= 1, got {value}")


def build_parser() -> Any:
    return make_parser(
        PROG, "Evaluate a policy on an env split: pass@1/pass@k; AppWorld TGC/SGC.", EvalConfig
    )


def _has_hook(env: Any) -> bool:
    try:
        return callable(env.get_wrapper_attr(HOOK))
    except AttributeError:
        return False


def prepare(cfg: EvalConfig) -> dict[str, Any]:
    """Check the options, the env and the adapter before any model is loaded (ValueError)."""
    from entrogym.envs.base import make_text_env, task_ids_of
    from entrogym.models import BUILTIN_MODELS, resolve_model
    from entrogym.train.evaluation import held_out_split

    served = bool(cfg.engine_urls)
    check_env_id(cfg.env)
    check_model(cfg.model, served=served)
    if cfg.out is not None:
        check_writable_dir(cfg.out, "out")
    if cfg.model in BUILTIN_MODELS and not served:
        check_cache()
    appworld = legacy.is_appworld(cfg.env)
    env_kwargs = legacy.env_kwargs_for(cfg, appworld)
    env = make_text_env(cfg.env, **env_kwargs)  # unknown split / bad data fail here, cheaply
    try:
        resolve = getattr(env.unwrapped, "resolve_split", None)  # TextEnv checks the name
        split = held_out_split(env) if cfg.split is None else cfg.split
        split = resolve(split) if resolve is not None else split
        tasks = all_tasks = task_ids_of(env, split)
        hook = _has_hook(env)
    finally:
        env.close()
    tasks = tasks[: cfg.max_tasks] if cfg.max_tasks is not None else tasks
    if cfg.adapter is not None:
        check_adapter_base(cfg.adapter, cfg.model, None if served else resolve_model(cfg.model))
    experiment, skipped = None, None
    if appworld and not hook:
        # keep the outputs in one experiment folder for AppWorld's own report; without it the
        # env deletes them after each episode
        skipped = legacy.report_skip_reason(cfg.samples)
        if skipped is None:
            experiment = f"entrogym-eval-{uuid.uuid4().hex[:8]}"
            env_kwargs["experiment_name"] = experiment
    report_name = split if len(tasks) == len(all_tasks) else f"{split}-first{len(tasks)}"
    return {"appworld": appworld, "hook": hook, "experiment": experiment, "tasks": tasks,
            "env_kwargs": env_kwargs, "split": split, "report_name": report_name,
            "report_skipped": skipped}  # fmt: skip


def _rollouts(cfg: EvalConfig, prepared: dict[str, Any]) -> Any:
    from entrogym.agents.agent import LLMAgent
    from entrogym.agents.engines import make_engine
    from entrogym.train.evaluation import evaluate_policy

    engine = make_engine(cfg.engine, cfg.model, **cfg.engine_kwargs(seed=cfg.seed))
    try:
        agent_kwargs = cfg.agent_kwargs()
        if agent_kwargs["on_turn_budget"] is None:
            # AppWorld: a cut turn still runs its code (the world is evaluated at the end)
            agent_kwargs["on_turn_budget"] = "step" if prepared["appworld"] else "truncate"
        agent = LLMAgent.from_model(cfg.model, **agent_kwargs)
        return evaluate_policy(
            engine, agent, cfg.env, split=prepared["split"], samples=cfg.samples,
            max_tasks=cfg.max_tasks, adapter=cfg.adapter, temperature=cfg.temperature,
            seed=cfg.seed, env_kwargs=prepared["env_kwargs"],
        )  # fmt: skip
    finally:
        engine.close()


def _env_extras(cfg: EvalConfig, prepared: dict[str, Any], results: dict[str, Any]) -> dict:
    """Summary fields the env adds: its ``evaluation_report`` hook, or the legacy AppWorld code."""
    if prepared["hook"]:
        from entrogym.envs.base import make_text_env

        env = make_text_env(cfg.env, **prepared["env_kwargs"])
        try:
            out_dir = Path(cfg.out) if cfg.out is not None else None
            return dict(env.get_wrapper_attr(HOOK)(results, out_dir, **prepared))
        finally:
            env.close()
    if not prepared["appworld"]:
        return {}
    episodes, tasks = results["episodes"], prepared["tasks"]
    extras = legacy.appworld_metrics(episodes, tasks, cfg.samples)
    # an episode that ended on an error (a failed reset or step) was never scored by
    # /evaluate and counts as not completed in TGC/SGC
    extras["not_evaluated"] = sum(e.info.get("num_tests") is None for e in episodes)
    experiment = prepared["experiment"]
    if experiment is None:
        extras["appworld_report"] = {"ok": None, "skipped": prepared["report_skipped"]}
        return extras
    extras["experiment_name"] = experiment
    extras["appworld_report"] = legacy.appworld_report(
        prepared["env_kwargs"]["appworld_root"], experiment, prepared["report_name"], tasks
    )
    return extras


def task_rows(per_task: list[dict], episodes: list[Any], appworld: bool) -> list[dict]:
    """The per-task rows of eval.json: turns per sample, and AppWorld's test counts."""
    rows = []
    for row in per_task:
        row = dict(row)
        eps = [e for e in episodes if e.task_id == row["task_id"]]
        row["num_turns"] = [e.num_turns for e in eps]
        if appworld:
            for key in ("passes", "fails", "num_tests", "truncated_by"):
                row[key] = [e.info.get(key) for e in eps]
            row["scenario_id"] = eps[0].info.get("scenario_id") if eps else None
        rows.append(row)
    return rows


def run_eval(cfg: EvalConfig, prepared: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    result = _rollouts(cfg, prepared)
    summary: dict[str, Any] = {
        "env": cfg.env,
        "model": cfg.model,
        "adapter": cfg.adapter,
        "engine": cfg.engine,
        **result.summary,
        "episodes": len(result.episodes),
        "truncated": sum(bool(e.truncated) for e in result.episodes),
        "errors": sum("error" in e.info for e in result.episodes),
    }
    per_task = task_rows(result.per_task, result.episodes, prepared["appworld"])
    results = {"summary": summary, "per_task": per_task, "episodes": result.episodes}
    summary.update(_env_extras(cfg, prepared, results))
    summary["wall_s"] = time.perf_counter() - t0
    return {"summary": summary, "per_task": per_task, "options": asdict(cfg)}


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


def print_report(cfg: EvalConfig, report: dict[str, Any]) -> None:
    summary = report["summary"]
    if cfg.json:
        print(json.dumps(summary, indent=2, default=str))
        return
    print(human_summary(summary))
    if "appworld_report" in summary:
        print(legacy.report_line(summary["appworld_report"]))
    if summary.get("not_evaluated"):
        print(legacy.not_evaluated_line(summary))
    if cfg.out is not None:
        print(f"wrote {Path(cfg.out) / 'eval.json'}")


def cli(argv: list[str]) -> int:
    def body() -> int:
        cfg = parse_options(build_parser(), argv, EvalConfig)
        try:
            prepared = prepare(cfg)
        except (TypeError, FileNotFoundError) as exc:  # not a text env; a missing data file
            raise ValueError(str(exc)) from exc
        report = run_eval(cfg, prepared)
        if cfg.out is not None:
            text = json.dumps(report, indent=2, default=str)
            atomic_write_text(Path(cfg.out) / "eval.json", text)
        print_report(cfg, report)
        return 0

    return run_command(PROG, body)
