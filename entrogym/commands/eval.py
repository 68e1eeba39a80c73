"""``entrogym eval``: evaluate a policy on an env split and write ``OUT/eval.json``.

Rollouts and pass@1 / pass@k come from :func:`entrogym.train.evaluation.evaluate_policy`; the
default split is the env's held-out one (never train). Everything env-specific comes from the
env's optional evaluation hooks (:class:`entrogym.envs.contract.EvaluationHooks`), reached with
``env.get_wrapper_attr``: its default turn-budget rule, extra env kwargs for the rollouts,
extra per-task columns and extra summary fields (e.g. an env's own completion metrics).
This module knows no env by name.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from entrogym.agents.config import TURN_BUDGET_RULES, AgentConfig
from entrogym.atomic import atomic_write_text
from entrogym.commands.adapters import check_adapter_base
from entrogym.commands.options import make_parser, parse_options, run_command
from entrogym.commands.preflight import check_cache, check_env_id, check_model, check_writable_dir

PROG = "entrogym eval"
ENV_KWARGS_HOOK = "evaluation_env_kwargs"
TASK_FIELDS_HOOK = "evaluation_task_fields"
REPORT_HOOK = "evaluation_report"
# keys of evaluation_report's answer that are for the printed summary only (not in eval.json)
DISPLAY_KEYS = ("summary_text", "report_lines")
# options that are shortcuts for one env keyword argument each (kept from earlier versions)
ENV_KWARG_SHORTCUTS = ("split", "max_turns", "appworld_root")


@dataclass
class EvalConfig(AgentConfig):
    """What to evaluate (the rollout options, model to system_prompt, are shared with train).

    Args:
        env: env id to evaluate on (``module:id`` imports ``module`` first, as for train).
        env_kwargs: keyword arguments for ``gymnasium.make(env, **env_kwargs)``.
        split: split to evaluate (None = the env's held-out split: its eval_split, else test);
            also passed to the env as its ``split`` keyword.
        adapter: LoRA adapter folder (refused if it was trained on another base model).
        urls: base URLs of running ``vllm serve`` instances (the same as engine_urls).
        samples: samples per task (k of pass@k).
        max_tasks: evaluate the first N tasks of the split only.
        out: folder for eval.json (None = print only).
        seed: seed of the rollouts.
        appworld_root: shortcut for the env keyword ``appworld_root`` (an env's data root).
        max_turns: shortcut for the env keyword ``max_turns`` (actions per episode of a
            multi-turn env; None = the env's evaluation default).
        report_options: keyword options for the env's evaluation_report hook (see its docs).
        json: print the summary as JSON.
        max_response_tokens: per-turn generation budget.
        on_turn_budget: a turn that hits max_response_tokens (None = the env's rule, its
            on_turn_budget attribute, else truncate: the episode ends).
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
    report_options: dict[str, Any] = field(default_factory=dict)
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

    def user_env_kwargs(self) -> dict[str, Any]:
        """``env_kwargs`` plus the shortcut options that were given; one keyword given two
        different ways is a ValueError."""
        kwargs = dict(self.env_kwargs)
        for name in ENV_KWARG_SHORTCUTS:
            value = getattr(self, name)
            if value is None:
                continue
            if name in kwargs and kwargs[name] != value:
                raise ValueError(
                    f"env keyword {name!r} given twice: --{name.replace('_', '-')} {value!r} "
                    f"and --env-kwargs {name}={kwargs[name]!r}; pass it once"
                )
            kwargs[name] = value
        return kwargs


@dataclass
class Prepared:
    """What :func:`prepare` found out about the env before any model is loaded."""

    split: str
    tasks: list[str]
    env_kwargs: dict[str, Any]  # the rollouts' env kwargs: the env's evaluation ones + the user's
    on_turn_budget: str
    report_name: str
    hooks: frozenset[str]  # the optional evaluation hooks the env has


def build_parser() -> Any:
    return make_parser(
        PROG, "Evaluate a policy on an env split: pass@1/pass@k plus the env's own metrics.",
        EvalConfig,
    )  # fmt: skip


def _make_env(env_id: str, kwargs: dict[str, Any]) -> Any:
    """The env, with a bad env keyword (e.g. --max-turns for a single-turn env) as a ValueError."""
    from entrogym.envs.base import make_text_env

    try:
        return make_text_env(env_id, **kwargs)
    except TypeError as exc:
        if "keyword argument" not in str(exc):
            raise  # not a text env: the command reports it
        raise ValueError(
            f"env {env_id!r} does not take the env keywords {sorted(kwargs)} ({exc}); "
            "--split, --max-turns and --appworld-root are env keywords too"
        ) from exc


def _hooks(env: Any) -> frozenset[str]:
    from entrogym.envs.base import env_attr

    names = (ENV_KWARGS_HOOK, TASK_FIELDS_HOOK, REPORT_HOOK)
    return frozenset(n for n in names if callable(env_attr(env, n)))


def _turn_budget_rule(cfg: EvalConfig, env: Any) -> str:
    """The user's ``on_turn_budget``, else the env's declared rule, else ``truncate``."""
    from entrogym.envs.base import env_attr

    if cfg.on_turn_budget is not None:
        return cfg.on_turn_budget
    rule = env_attr(env, "on_turn_budget", None) or "truncate"
    if rule not in TURN_BUDGET_RULES:
        raise ValueError(
            f"env {cfg.env!r} declares on_turn_budget={rule!r}; it must be one of "
            f"{list(TURN_BUDGET_RULES)}"
        )
    return rule


def _split_and_tasks(cfg: EvalConfig, env: Any) -> tuple[str, list[str]]:
    """The split to evaluate (checked by the env) and all of its task ids."""
    from entrogym.envs.base import task_ids_of
    from entrogym.train.evaluation import held_out_split

    resolve = getattr(env.unwrapped, "resolve_split", None)  # TextEnv checks the name
    split = held_out_split(env) if cfg.split is None else cfg.split
    split = resolve(split) if resolve is not None else split
    return split, task_ids_of(env, split)


def prepare(cfg: EvalConfig) -> Prepared:
    """Check the options, the env and the adapter before any model is loaded (ValueError)."""
    from entrogym.models import BUILTIN_MODELS, resolve_model

    served = bool(cfg.engine_urls)
    check_env_id(cfg.env)
    check_model(cfg.model, served=served)
    if cfg.out is not None:
        check_writable_dir(cfg.out, "out")
    if cfg.model in BUILTIN_MODELS and not served:
        check_cache()
    user_kwargs = cfg.user_env_kwargs()
    env = _make_env(cfg.env, user_kwargs)  # unknown split / bad data fail here, cheaply
    try:
        hooks = _hooks(env)
        env_kwargs: dict[str, Any] = {}
        if ENV_KWARGS_HOOK in hooks:
            env_kwargs = dict(env.get_wrapper_attr(ENV_KWARGS_HOOK)(cfg.samples))
        on_turn_budget = _turn_budget_rule(cfg, env)
        if not env_kwargs:
            split, all_tasks = _split_and_tasks(cfg, env)
    finally:
        env.close()
    if env_kwargs:  # the tasks are those of the env the rollouts make
        env_kwargs.update(user_kwargs)  # the user's env kwargs win over the env's own
        env = _make_env(cfg.env, env_kwargs)
        try:
            split, all_tasks = _split_and_tasks(cfg, env)
        finally:
            env.close()
    if cfg.report_options and REPORT_HOOK not in hooks:
        raise ValueError(f"report_options: env {cfg.env!r} has no {REPORT_HOOK} hook to take them")
    tasks = all_tasks[: cfg.max_tasks] if cfg.max_tasks is not None else all_tasks
    if cfg.adapter is not None:
        check_adapter_base(cfg.adapter, cfg.model, None if served else resolve_model(cfg.model))
    report_name = split if len(tasks) == len(all_tasks) else f"{split}-first{len(tasks)}"
    return Prepared(split, tasks, env_kwargs or user_kwargs, on_turn_budget, report_name, hooks)


def _rollouts(cfg: EvalConfig, prepared: Prepared) -> Any:
    from entrogym.agents.agent import LLMAgent
    from entrogym.agents.engines import make_engine
    from entrogym.train.evaluation import evaluate_policy

    engine = make_engine(cfg.engine, cfg.model, **cfg.engine_kwargs(seed=cfg.seed))
    try:
        agent_kwargs = {**cfg.agent_kwargs(), "on_turn_budget": prepared.on_turn_budget}
        agent = LLMAgent.from_model(cfg.model, **agent_kwargs)
        return evaluate_policy(
            engine, agent, cfg.env, split=prepared.split, samples=cfg.samples,
            max_tasks=cfg.max_tasks, adapter=cfg.adapter, temperature=cfg.temperature,
            seed=cfg.seed, env_kwargs=prepared.env_kwargs,
        )  # fmt: skip
    finally:
        engine.close()


def task_rows(per_task: list[dict], episodes: list[Any]) -> list[dict]:
    """The per-task rows of eval.json: the evaluation's counts, plus the turns and the limit
    that cut each sample (``truncated_by``: None, ``turn``, ``context`` or ``env``)."""
    rows = []
    for row in per_task:
        eps = [e for e in episodes if e.task_id == row["task_id"]]
        row = {**row, "num_turns": [e.num_turns for e in eps]}
        row["truncated_by"] = [e.info.get("truncated_by") for e in eps]
        rows.append(row)
    return rows


def _env_hooks(
    cfg: EvalConfig, prepared: Prepared, results: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the env's per-task and report hooks: they add columns to ``results["per_task"]``
    (in place) and return ``(summary fields, display items)``."""
    from entrogym.envs.base import make_text_env

    if not prepared.hooks & {TASK_FIELDS_HOOK, REPORT_HOOK}:
        return {}, {}
    env = make_text_env(cfg.env, **prepared.env_kwargs)
    try:
        if TASK_FIELDS_HOOK in prepared.hooks:
            task_fields = env.get_wrapper_attr(TASK_FIELDS_HOOK)
            for row in results["per_task"]:
                eps = [e for e in results["episodes"] if e.task_id == row["task_id"]]
                row.update(task_fields(row["task_id"], eps))
        if REPORT_HOOK not in prepared.hooks:
            return {}, {}
        out_dir = Path(cfg.out) if cfg.out is not None else None
        options = {"report_name": prepared.report_name, **cfg.report_options}
        fields = dict(env.get_wrapper_attr(REPORT_HOOK)(results, out_dir, **options))
    finally:
        env.close()
    display = {key: fields.pop(key) for key in DISPLAY_KEYS if key in fields}
    return fields, display


def run_eval(cfg: EvalConfig, prepared: Prepared) -> tuple[dict[str, Any], dict[str, Any]]:
    """Roll out, then add the env's fields: ``(eval.json's content, display items)``."""
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
    per_task = task_rows(result.per_task, result.episodes)
    results = {"summary": summary, "per_task": per_task, "episodes": result.episodes,
               "tasks": list(prepared.tasks), "samples": cfg.samples, "split": prepared.split}  # fmt: skip
    fields, display = _env_hooks(cfg, prepared, results)
    summary.update(fields)
    summary["wall_s"] = time.perf_counter() - t0
    return {"summary": summary, "per_task": per_task, "options": asdict(cfg)}, display


def human_summary(summary: dict[str, Any], display: dict[str, Any]) -> str:
    k = summary["samples"]
    parts = [f"{summary['env']} [{summary['split']}] {summary['model']}:"]
    parts.append(f"tasks={summary['tasks']} samples={k} pass@1={summary['pass@1']:.4f}")
    if k > 1:
        parts.append(f"pass@{k}={summary[f'pass@{k}']:.4f}")
    if display.get("summary_text"):
        parts.append(str(display["summary_text"]))
    parts.append(f"({summary['wall_s']:.1f} s)")
    return " ".join(parts)


def print_report(cfg: EvalConfig, report: dict[str, Any], display: dict[str, Any]) -> None:
    summary = report["summary"]
    if cfg.json:
        print(json.dumps(summary, indent=2, default=str))
        return
    print(human_summary(summary, display))
    for line in display.get("report_lines") or ():
        print(line)
    if cfg.out is not None:
        print(f"wrote {Path(cfg.out) / 'eval.json'}")


def cli(argv: list[str]) -> int:
    def body() -> int:
        cfg = parse_options(build_parser(), argv, EvalConfig)
        try:
            prepared = prepare(cfg)
        except (TypeError, FileNotFoundError) as exc:  # not a text env; a missing data file
            raise ValueError(str(exc)) from exc
        report, display = run_eval(cfg, prepared)
        if cfg.out is not None:
            text = json.dumps(report, indent=2, default=str)
            atomic_write_text(Path(cfg.out) / "eval.json", text)
        print_report(cfg, report, display)
        return 0

    return run_command(PROG, body)
