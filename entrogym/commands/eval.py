"""``entrogym eval``: evaluate a policy on an env split and write ``OUT/eval.json``.

The command only: options, checks before any model loads, printing and the exit code. What is
evaluated and how it is scored (the held-out split, the env's evaluation hooks, pass@k, env
errors) is :mod:`entrogym.train.evaluation.evaluate`, which the trainer's in-run eval uses too. Past
``--max-env-error-fraction`` the results are printed and saved, and the exit code is 1.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from entrogym.agents.config import AgentConfig
from entrogym.atomic import atomic_write_text
from entrogym.commands.options import make_parser, parse_options, run_command
from entrogym.commands.preflight import (
    check_cache,
    check_env_id,
    check_model,
    check_model_fits,
    check_writable_dir,
)
from entrogym.train.evaluation.evaluate import (
    REPORT_HOOK,
    EvalPlan,
    pass_at_ks,
    plan_evaluation,
    run_evaluation,
)
from entrogym.train.folder.adapter_check import verify_adapter
from entrogym.train.folder.layout import TOOL_ERRORS_FILE
from entrogym.train.folder.turn_metrics import turns_text

PROG = "entrogym eval"
# options that are shortcuts for one env keyword argument each (kept from earlier versions)
ENV_KWARG_SHORTCUTS = ("split", "appworld_root")


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
        samples: samples per task: pass@k is reported at k = 1, 4, 16, 64 up to it, and at it.
        pass_at: more ks to report pass@k at (each from 1 to --samples).
        max_tasks: evaluate the first N tasks of the split only.
        out: folder for eval.json (None = print only).
        seed: seed of the rollouts.
        appworld_root: shortcut for the env keyword ``appworld_root`` (an env's data root).
        report_options: keyword options for the env's evaluation_report hook (see its docs).
        json: print the summary as JSON.
        max_env_error_fraction: share of the episodes that may fail on env errors; past it the
            results are still printed and saved, and the command exits with code 1.
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
    pass_at: list[int] = field(default_factory=list)
    max_tasks: int | None = None
    out: str | None = None
    seed: int = 0
    appworld_root: str | None = None
    report_options: dict[str, Any] = field(default_factory=dict)
    json: bool = False
    max_response_tokens: int = 1024
    on_turn_budget: Literal["truncate", "step"] | None = None
    max_env_error_fraction: float = 0.5

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
        try:
            pass_at_ks(self.samples, self.pass_at)
        except ValueError as exc:
            raise ValueError(f"pass_at (--pass-at): {exc}") from exc
        if not 0 <= self.max_env_error_fraction <= 1:
            raise ValueError(
                f"max_env_error_fraction must be in [0, 1], got {self.max_env_error_fraction}"
            )
        if self.max_tasks is not None and self.max_tasks < 1:
            raise ValueError(f"max_tasks (--max-tasks) must be >= 1, got {self.max_tasks}")

    def user_env_kwargs(self) -> dict[str, Any]:
        """``env_kwargs`` plus the shortcut options that were given, and ``max_turns`` for an
        env that takes it (:meth:`AgentConfig.env_kwargs_for`); one keyword given two different
        ways is a ValueError."""
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
        return self.env_kwargs_for(self.env, kwargs)


def build_parser() -> Any:
    parser = make_parser(
        PROG, "Evaluate a policy on an env split: pass@k plus the env's own metrics.",
        EvalConfig,
    )  # fmt: skip
    for action in parser._actions:
        if action.dest == "pass_at":
            action.metavar = "K [K ...]"
    return parser


def prepare(cfg: EvalConfig) -> EvalPlan:
    """Check the options, the env and the adapter before any model is loaded (ValueError)."""
    from entrogym.models import BUILTIN_MODELS

    served = bool(cfg.engine_urls)
    check_env_id(cfg.env)
    check_model(cfg.model, served=served)
    if cfg.out is not None:
        check_writable_dir(cfg.out, "out")
    if cfg.model in BUILTIN_MODELS and not served:
        check_cache()
    check_model_fits(cfg)
    try:
        plan = plan_evaluation(cfg.env, cfg.user_env_kwargs(), split=cfg.split,
                               max_tasks=cfg.max_tasks, samples=cfg.samples,
                               on_turn_budget=cfg.on_turn_budget)  # fmt: skip
    except ValueError as exc:
        if "does not take the env keywords" not in str(exc):
            raise
        raise ValueError(f"{exc}; --split and --appworld-root are env keywords too") from exc
    if cfg.report_options and REPORT_HOOK not in plan.hooks:
        raise ValueError(f"report_options: env {cfg.env!r} has no {REPORT_HOOK} hook to take them")
    if cfg.adapter is not None:
        verify_adapter(cfg.adapter, cfg.model, option="adapter", served=served)
    return plan


def run_eval(cfg: EvalConfig, plan: EvalPlan) -> tuple[dict[str, Any], dict[str, Any]]:
    """Roll out and score (:func:`entrogym.train.evaluation.evaluate.run_evaluation`):
    ``(eval.json's content, display items)``."""
    from entrogym.agents.agent import LLMAgent
    from entrogym.agents.engines import make_engine

    t0 = time.perf_counter()
    engine = make_engine(cfg.engine, cfg.model, **cfg.engine_kwargs(seed=cfg.seed))
    try:
        agent_kwargs = {**cfg.agent_kwargs(), "on_turn_budget": plan.on_turn_budget}
        agent = LLMAgent.from_model(cfg.model, **agent_kwargs)
        result = run_evaluation(
            engine, agent, plan, samples=cfg.samples, adapter=cfg.adapter,
            temperature=cfg.temperature, seed=cfg.seed, out_dir=cfg.out,
            report_options=cfg.report_options, pass_at=cfg.pass_at,
            turn_rewards=cfg.turn_rewards,
            tool_error_log=None if cfg.out is None else Path(cfg.out) / TOOL_ERRORS_FILE,
        )  # fmt: skip
    finally:
        engine.close()
    summary = {"env": cfg.env, "model": cfg.model, "adapter": cfg.adapter, "engine": cfg.engine,
               **result.summary, "wall_s": time.perf_counter() - t0}  # fmt: skip
    return {"summary": summary, "per_task": result.per_task, "options": asdict(cfg)}, result.display


def error_budget_exceeded(cfg: EvalConfig, summary: dict[str, Any], display: dict[str, Any]) -> str:
    """The one-line reason the evaluation failed its env-error budget, or "" when it held."""
    errors, episodes = summary["env_errors"], summary["episodes"]
    if not episodes or errors / episodes <= cfg.max_env_error_fraction:
        return ""
    return (
        f"{errors} of {episodes} episodes failed on env errors, more than "
        f"--max-env-error-fraction={cfg.max_env_error_fraction:g}, so pass@k measures the env, "
        f"not the policy; fix the env. The first: {display.get('first_error')}"
    )


def _score(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _pass_at_k_text(summary: dict[str, Any]) -> str:
    """``pass@1=0.2500 @4=0.5000 @8=0.7500``: every pass@k of the summary, k ascending."""
    ks = sorted(int(key[5:]) for key in summary if key[:5] == "pass@" and key[5:].isdigit())
    return " ".join(f"{'pass' if i == 0 else ''}@{k}={_score(summary[f'pass@{k}'])}"
                    for i, k in enumerate(ks))  # fmt: skip


def human_summary(summary: dict[str, Any], display: dict[str, Any]) -> str:
    k = summary["samples"]
    parts = [f"{summary['env']} [{summary['split']}] {summary['model']}:"]
    parts.append(f"tasks={summary['tasks']} samples={k} {_pass_at_k_text(summary)}")
    if k > 1 and summary["distinct_correct_mean"] is not None:
        parts.append(f"distinct_correct={summary['distinct_correct_mean']:.2f}")
    parts.append(f"env_errors={summary['env_errors']}{turns_text(summary)}")
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
            plan = prepare(cfg)
        except (TypeError, FileNotFoundError) as exc:  # not a text env; a missing data file
            raise ValueError(str(exc)) from exc
        report, display = run_eval(cfg, plan)
        if cfg.out is not None:
            text = json.dumps(report, indent=2, default=str)
            atomic_write_text(Path(cfg.out) / "eval.json", text)
        print_report(cfg, report, display)
        failed = error_budget_exceeded(cfg, report["summary"], display)
        if failed:  # the results are printed and saved; the exit code says they do not count
            print(f"{PROG}: error: {failed}", file=sys.stderr)
            return 1
        return 0

    return run_command(PROG, body)
