"""Evaluation of a policy on an env split: the one implementation behind the trainer's in-run
eval rows and ``entrogym eval``.

:func:`plan_evaluation` settles, before any model loads, what is evaluated: the split (the
env's held-out one by default, never train), its tasks, the env kwargs of the rollouts and the
turn-budget rule. Everything env-specific comes from the env's optional evaluation hooks
(:class:`entrogym.envs.contract.EvaluationHooks`), reached with ``env.get_wrapper_attr``.
:func:`run_evaluation` then rolls out ``samples`` episodes of every task (no early stopping,
sampling seeded where the engine allows it) and reports pass@k (:func:`pass_at_ks`) and the
distinct correct answers over the episodes that ran, the env errors, and the env's own fields
(its per-task columns and report). The same adapter, tasks and seed give the same numbers in a
run and in ``entrogym eval``. The scores themselves are :mod:`entrogym.train.evaluation.scores`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entrogym.agents.agent import LLMAgent
from entrogym.agents.config import turn_budget_rule
from entrogym.agents.engines import Engine, SamplingParams
from entrogym.agents.rollout import collect_rollouts
from entrogym.envs.base import env_attr, make_text_env, task_ids_of
from entrogym.train.evaluation.scores import (
    distinct_correct,
    final_answer,
    mean_pass_at_k,
    pass_at_k,
    pass_at_ks,
)
from entrogym.train.folder.turn_metrics import episode_turn_metrics, sampler_entropy_by_turn
from entrogym.train.progress import counter

__all__ = [  # the scores are re-exported: callers import them from here
    "EvalPlan",
    "EvalResult",
    "evaluate_policy",
    "held_out_split",
    "mean_pass_at_k",
    "pass_at_k",
    "pass_at_ks",
    "plan_evaluation",
    "run_evaluation",
]

ENV_KWARGS_HOOK = "evaluation_env_kwargs"
TASK_FIELDS_HOOK = "evaluation_task_fields"
REPORT_HOOK = "evaluation_report"
# keys of evaluation_report's answer that are for the printed summary only (not stored)
DISPLAY_KEYS = ("summary_text", "report_lines")


def held_out_split(env: Any) -> str:
    """The split an evaluation uses by default: the env's declared ``eval_split`` attribute when
    it has one, else ``test``, else the first split whose name starts with ``test`` (AppWorld's
    ``test_normal``). An env with no such split is a ValueError: pass the split explicitly."""
    inner = env.unwrapped
    declared = getattr(inner, "eval_split", None)
    if declared:
        return str(declared)
    splits = tuple(getattr(inner, "splits", ()))
    for name in ("test", *(s for s in splits if s.startswith("test"))):
        if name in splits:
            return name
    raise ValueError(
        f"{type(inner).__name__} declares no held-out split (its splits: {list(splits)}); "
        "name the split to evaluate (--split / eval_split), or give the env an eval_split "
        "attribute"
    )


# ----- the plan: what is evaluated (no model needed) --------------------------------------------


@dataclass
class EvalPlan:
    """What :func:`plan_evaluation` found out about the env before any model is loaded."""

    env: str
    split: str
    tasks: list[str]
    all_tasks: int  # tasks in the split (``tasks`` may be its first N)
    env_kwargs: dict[str, Any]  # the rollouts' env kwargs: the env's evaluation ones + the user's
    on_turn_budget: str
    hooks: frozenset[str]  # the optional evaluation hooks the env has

    @property
    def report_name(self) -> str:
        """The split, or ``SPLIT-firstN`` for its first N tasks (the env report's name)."""
        return (
            self.split
            if len(self.tasks) == self.all_tasks
            else f"{self.split}-first{len(self.tasks)}"
        )


def _make_env(env_id: str, kwargs: dict[str, Any]) -> Any:
    """The env, with a bad env keyword (e.g. --max-turns for a single-turn env) as a ValueError."""
    try:
        return make_text_env(env_id, **kwargs)
    except TypeError as exc:
        if "keyword argument" not in str(exc):
            raise  # not a text env: the caller reports it
        raise ValueError(
            f"env {env_id!r} does not take the env keywords {sorted(kwargs)} ({exc})"
        ) from exc


def _hooks(env: Any) -> frozenset[str]:
    names = (ENV_KWARGS_HOOK, TASK_FIELDS_HOOK, REPORT_HOOK)
    return frozenset(n for n in names if callable(env_attr(env, n)))


def _split_and_tasks(env: Any, split: str | None) -> tuple[str, list[str]]:
    """The split to evaluate (checked by the env) and all of its task ids."""
    resolve = getattr(env.unwrapped, "resolve_split", None)  # TextEnv checks the name
    split = held_out_split(env) if split is None else split
    split = resolve(split) if resolve is not None else split
    return split, task_ids_of(env, split)


def plan_evaluation(
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    *,
    split: str | None = None,
    max_tasks: int | None = None,
    samples: int = 1,
    on_turn_budget: str | None = None,
) -> EvalPlan:
    """The split (None: the env's held-out one), its first ``max_tasks`` tasks, the rollouts'
    env kwargs (the env's ``evaluation_env_kwargs(samples)``, then the user's ``env_kwargs``,
    which win) and the turn-budget rule (``on_turn_budget``, else the env's, else
    ``truncate``: :func:`~entrogym.agents.config.turn_budget_rule`).
    A bad split, keyword or rule is a ValueError."""
    user = dict(env_kwargs or {})
    env = _make_env(env_id, user)  # unknown split / bad data fail here, cheaply
    try:
        hooks = _hooks(env)
        kwargs = (
            dict(env.get_wrapper_attr(ENV_KWARGS_HOOK)(samples)) if ENV_KWARGS_HOOK in hooks else {}
        )
        rule = turn_budget_rule(env_id, env, on_turn_budget)
        if not kwargs:
            split, tasks = _split_and_tasks(env, split)
    finally:
        env.close()
    if kwargs:  # the tasks are those of the env the rollouts make
        kwargs.update(user)
        env = _make_env(env_id, kwargs)
        try:
            split, tasks = _split_and_tasks(env, split)
        finally:
            env.close()
    chosen = tasks[:max_tasks] if max_tasks is not None else tasks
    if not chosen:
        raise ValueError(f"env {env_id!r} has no tasks in split {split!r}")
    return EvalPlan(env_id, split, chosen, len(tasks), kwargs or user, rule, hooks)


# ----- the run ---------------------------------------------------------------------------------


@dataclass
class EvalResult:
    """``summary`` (pass@k, distinct correct answers, counts and the env's fields), one
    ``per_task`` row per task, the ``episodes``, and ``display``: what the env's report asks
    to print, not to store."""

    summary: dict[str, Any]
    per_task: list[dict[str, Any]] = field(default_factory=list)
    episodes: list[Any] = field(default_factory=list)
    display: dict[str, Any] = field(default_factory=dict)


def _correct_answers(episodes: list[Any]) -> list[str]:
    """The final answers of the correct episodes among ``episodes`` that ran."""
    from entrogym.train.batch import is_success

    return [final_answer(e.info) for e in episodes if not e.failed and is_success(e)]


def _scores(
    plan: EvalPlan, episodes: list[Any], samples: int, pass_at: Sequence[int] = ()
) -> dict[str, Any]:
    """pass@k for every k of :func:`pass_at_ks` (``samples``, ``pass_at``) and the mean number
    of distinct correct answers per task, over the episodes that ran: an env error is not a
    wrong answer, so its episode is counted in ``env_errors`` and left out (the scores are None
    when no episode ran)."""
    from entrogym.train.batch import is_success

    ran = [e for e in episodes if not e.failed]
    correct = {t: [is_success(e) for e in ran if e.task_id == t] for t in plan.tasks}
    scored = [t for t, v in correct.items() if v]
    at_k = {
        f"pass@{k}": mean_pass_at_k(correct, k) if scored else None
        for k in pass_at_ks(samples, pass_at)
    }
    distinct = [
        distinct_correct(_correct_answers([e for e in ran if e.task_id == t])) for t in scored
    ]
    return {
        **at_k,
        "accuracy": at_k["pass@1"],
        "distinct_correct_mean": sum(distinct) / len(distinct) if scored else None,
        "reward_mean": sum(e.reward for e in ran) / len(ran) if ran else None,
        "episodes": len(episodes),
        "env_errors": len(episodes) - len(ran),
        "tasks_scored": len(scored),
        "truncated": sum(bool(e.truncated) for e in episodes),
    }


def _task_rows(plan: EvalPlan, episodes: list[Any]) -> list[dict[str, Any]]:
    """Per task: its samples, the correct ones and their distinct final answers, rewards,
    turns, the limit that cut each sample (``truncated_by``: None, ``turn``, ``context`` or
    ``env``) and its env errors."""
    rows = []
    for task in plan.tasks:
        eps = [e for e in episodes if e.task_id == task]
        answers = _correct_answers(eps)
        rows.append({
            "task_id": task,
            "samples": len(eps),
            "correct": len(answers),
            "distinct_correct": distinct_correct(answers),
            "rewards": [e.reward for e in eps],
            "num_turns": [e.num_turns for e in eps],
            "truncated_by": [e.info.get("truncated_by") for e in eps],
            "env_errors": sum(e.failed for e in eps),
        })  # fmt: skip
    return rows


def _env_fields(
    plan: EvalPlan, results: dict[str, Any], out_dir: Path | None, report_options: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the env's per-task and report hooks: they add columns to ``results["per_task"]``
    (in place) and return ``(summary fields, display items)``."""
    if not plan.hooks & {TASK_FIELDS_HOOK, REPORT_HOOK}:
        return {}, {}
    env = make_text_env(plan.env, **plan.env_kwargs)
    try:
        if TASK_FIELDS_HOOK in plan.hooks:
            task_fields = env.get_wrapper_attr(TASK_FIELDS_HOOK)
            for row in results["per_task"]:
                eps = [e for e in results["episodes"] if e.task_id == row["task_id"]]
                row.update(task_fields(row["task_id"], eps))
        if REPORT_HOOK not in plan.hooks:
            return {}, {}
        options = {"report_name": plan.report_name, **report_options}
        fields = dict(env.get_wrapper_attr(REPORT_HOOK)(results, out_dir, **options))
    finally:
        env.close()
    display = {key: fields.pop(key) for key in DISPLAY_KEYS if key in fields}
    return fields, display


def run_evaluation(
    engine: Engine,
    agent: LLMAgent,
    plan: EvalPlan,
    *,
    samples: int = 1,
    adapter: str | None = None,
    temperature: float = 1.0,
    seed: int = 0,
    out_dir: str | Path | None = None,
    report_options: dict[str, Any] | None = None,
    env_workers: Any = None,
    env_timeout: float | None = None,
    pass_at: Sequence[int] = (),
    turn_rewards: bool = False,
    tool_error_log: str | Path | None = None,
) -> EvalResult:
    """Roll out ``samples`` episodes of every task of ``plan`` with ``adapter`` and score them.
    ``env_workers`` / ``env_timeout``: where the envs run (``collect_rollouts``). ``pass_at``:
    ks to report pass@k at besides those of :func:`pass_at_ks` (each in 1..samples).
    ``turn_rewards``: the envs may pay per-turn rewards (``collect_rollouts``).
    ``tool_error_log``: the file the tracebacks of tools that raised are appended to.

    Episode ``i`` is reset with ``seed + i``, and sampling is seeded with ``seed`` where the
    engine allows (``Engine.seeded``: the hf engine), so the result does not depend on what
    the engine sampled before. ``agent`` is used with the plan's turn-budget rule.
    """
    if report_options and REPORT_HOOK not in plan.hooks:
        raise ValueError(f"report_options: env {plan.env!r} has no {REPORT_HOOK} hook to take them")
    pass_at_ks(samples, pass_at)  # a bad k fails before the rollouts
    if agent.on_turn_budget != plan.on_turn_budget:
        agent = agent.with_turn_budget_rule(plan.on_turn_budget)
    total = len(plan.tasks) * samples
    with engine.seeded(seed), counter(total, "eval", "episodes") as on_progress:
        episodes = collect_rollouts(
            plan.env,
            plan.tasks,
            engine,
            agent,
            k=samples,
            sampling=SamplingParams(temperature=temperature),
            adapter=adapter,
            early_stop=False,
            env_kwargs=plan.env_kwargs,
            seed=seed,
            env_workers=env_workers,
            env_timeout=env_timeout,
            on_progress=on_progress,
            turn_rewards=turn_rewards,
            tool_error_log=tool_error_log,
        )
    episodes = list(episodes)
    summary = {"split": plan.split, "tasks": len(plan.tasks), "samples": samples,
               **_scores(plan, episodes, samples, pass_at), **episode_turn_metrics(episodes),
               "sampler_entropy_by_turn": sampler_entropy_by_turn(episodes)}  # fmt: skip
    per_task = _task_rows(plan, episodes)
    results = {"summary": summary, "per_task": per_task, "episodes": episodes,
               "tasks": list(plan.tasks), "samples": samples, "split": plan.split}  # fmt: skip
    out = Path(out_dir) if out_dir is not None else None
    fields, display = _env_fields(plan, results, out, dict(report_options or {}))
    summary.update(fields)
    first_error = next((e.error for e in episodes if e.failed), None)
    return EvalResult(summary, per_task, episodes, {**display, "first_error": first_error})


def evaluate_policy(
    engine: Engine,
    agent: LLMAgent,
    env_id: str,
    *,
    split: str | None = None,
    samples: int = 1,
    max_tasks: int | None = None,
    adapter: str | None = None,
    temperature: float = 1.0,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
) -> EvalResult:
    """:func:`plan_evaluation` then :func:`run_evaluation`, with the agent's turn-budget rule."""
    plan = plan_evaluation(env_id, env_kwargs, split=split, max_tasks=max_tasks,
                           samples=samples, on_turn_budget=agent.on_turn_budget)  # fmt: skip
    return run_evaluation(engine, agent, plan, samples=samples, adapter=adapter,
                          temperature=temperature, seed=seed)  # fmt: skip
