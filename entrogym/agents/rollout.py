"""Rollout collection: K samples per task, all episodes stepped in lockstep.

Every step batches one generation call across all running episodes, then steps the envs whose
turn ended. Early stopping (paper appendix "Training") is checked after every step: once at
least ``min_done_per_task`` of the K rollouts of every task and ``min_done_fraction`` of all
rollouts are done, the rest are cancelled. With ``chunk_tokens`` a turn is generated in chunks
of that many tokens (a chunk continues from the ids sampled so far, so nothing changes but the
places where the loop can stop), which lets early stopping act inside long single-turn answers.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from entrogym.agents.agent import LLMAgent, Transcript, TurnEnd
from entrogym.agents.engines.base import Engine, SamplingParams
from entrogym.agents.episode import Episode

__all__ = ["Episode", "Rollouts", "collect_rollouts", "early_stop_reached"]


def early_stop_reached(
    done_per_task: Sequence[int], k: int, min_done_per_task: int = 4, min_done_fraction: float = 0.9
) -> bool:
    """Paper appendix "Training": stop once at least 4 of the 6 rollouts of every task and 90%
    of all rollouts are in. ``min_done_per_task`` is capped at ``k``."""
    need = min(min_done_per_task, k)
    total = k * len(done_per_task)
    return all(d >= need for d in done_per_task) and sum(done_per_task) >= math.ceil(
        min_done_fraction * total - 1e-9
    )


class Rollouts(list):
    """``list[Episode]`` with ``stats``: counts (episodes, cancelled, errors, truncated),
    generated tokens, time spent generating / stepping envs / in total, tokens per second."""

    stats: dict[str, Any]


@dataclass
class _Run:
    index: int
    task_id: str
    group_id: int
    env: Any = None
    t: Transcript | None = None
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    cancelled: bool = False
    truncated: bool = False
    generate_s: float = 0.0
    env_s: float = 0.0
    start: float = field(default_factory=time.perf_counter)
    end: float = 0.0

    def finish(self, reward: float = 0.0, truncated: bool = False, **info: Any) -> None:
        self.done, self.reward, self.truncated = True, float(reward), truncated
        self.info.update(info)
        self.end = time.perf_counter()

    def fail(self, where: str, error: BaseException) -> None:
        self.finish(0.0, error=f"{where}: {type(error).__name__}: {error}", success=False)


def _make_env(env: str | Callable[[], Any], env_kwargs: dict[str, Any]) -> Any:
    if callable(env):
        return env()
    from entrogym.envs.base import make_text_env

    return make_text_env(env, **env_kwargs)


def collect_rollouts(
    env: str | Callable[[], Any],
    task_ids: Sequence[str],
    engine: Engine,
    agent: LLMAgent,
    *,
    k: int = 6,
    sampling: SamplingParams | None = None,
    adapter: str | None = None,
    early_stop: bool = True,
    min_done_per_task: int = 4,
    min_done_fraction: float = 0.9,
    chunk_tokens: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
    group_offset: int = 0,
    keep_cancelled: bool = False,
    env_workers: int = 1,
) -> Rollouts:
    """Run ``k`` episodes of every task in ``task_ids`` and return them as :class:`Episode`\\ s.

    Args:
        env: a registered env id (made with ``gymnasium.make(env, **env_kwargs)``, one instance
            per episode) or a zero-argument factory.
        engine, agent: the sampler and the conversation bookkeeping; ``agent.max_context`` must
            fit in ``engine.max_model_len``.
        sampling: temperature / top-p / top-k; ``max_tokens`` and stop ids come from the agent.
        adapter: LoRA adapter folder of the current policy version (None = base model).
        early_stop, min_done_per_task, min_done_fraction: the early-stopping rule.
        chunk_tokens: generate turns in chunks of this many tokens (None = whole turns).
        seed: episode ``i`` is reset with ``seed + i``.
        group_offset: group id of the first task (group ids are ``group_offset + task index``).
        keep_cancelled: also return cancelled episodes (``info["cancelled"] = True``).
        env_workers: threads stepping envs (for envs whose steps wait on I/O).

    Env errors end that episode (reward 0, ``info["error"]``); an episode whose reset failed
    has no tokens and is reported in ``stats["reset_errors"]`` instead of being returned.
    """
    if k < 1:
        raise ValueError(f"k (samples per task) must be >= 1, got {k}")
    if not task_ids:
        raise ValueError("task_ids is empty; pass the tasks to roll out")
    if not 0 < min_done_fraction <= 1:
        raise ValueError(f"min_done_fraction must lie in (0, 1], got {min_done_fraction}")
    if chunk_tokens is not None and chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1 or None, got {chunk_tokens}")
    if agent.max_context > engine.max_model_len:
        raise ValueError(
            f"agent.max_context={agent.max_context} exceeds the engine's max_model_len="
            f"{engine.max_model_len}; lower max_context or start the engine with a longer context"
        )
    base = replace(sampling or SamplingParams(), stop_token_ids=agent.stop_token_ids)
    t_start = time.perf_counter()
    runs = [
        _Run(i * k + j, tid, group_offset + i) for i, tid in enumerate(task_ids) for j in range(k)
    ]
    stats: dict[str, Any] = {"steps": 0, "generate_calls": 0, "generated_tokens": 0}
    generate_s = env_s = 0.0
    pool = ThreadPoolExecutor(env_workers) if env_workers > 1 else None
    try:
        t0 = time.perf_counter()
        for r in runs:
            _begin(r, env, dict(env_kwargs or {}), agent, seed)
        env_s += time.perf_counter() - t0
        while active := [r for r in runs if not r.done]:
            params = []
            for r in active:
                budget = agent.turn_budget(r.t)
                params.append(replace(base, max_tokens=min(budget, chunk_tokens or budget)))
            t0 = time.perf_counter()
            completions = engine.generate([r.t.token_ids for r in active], params, adapter)
            dt = time.perf_counter() - t0
            generate_s += dt
            stats["generate_calls"] += 1
            ended: list[tuple[_Run, TurnEnd]] = []
            for r, c in zip(active, completions, strict=True):
                r.generate_s += dt
                stats["generated_tokens"] += len(c.token_ids)
                end = agent.add_completion(r.t, c)
                if end is not None:
                    ended.append((r, end))
            t0 = time.perf_counter()
            if pool is not None:
                list(pool.map(lambda a: _advance(*a, agent), ended))
            else:
                for r, end in ended:
                    _advance(r, end, agent)
            env_s += time.perf_counter() - t0
            stats["steps"] += 1
            if early_stop and any(not r.done for r in runs):
                done = [
                    sum(r.done for r in runs[i * k : (i + 1) * k]) for i in range(len(task_ids))
                ]
                if early_stop_reached(done, k, min_done_per_task, min_done_fraction):
                    for r in runs:
                        if not r.done:
                            r.cancelled = True
                            r.finish(0.0, cancelled=True)
    finally:
        if pool is not None:
            pool.shutdown()
        for r in runs:
            if r.env is not None:
                # Closing must not hide the episode's result.
                with contextlib.suppress(Exception):
                    r.env.close()
    out = Rollouts(
        _episode(r, env) for r in runs if r.t is not None and (keep_cancelled or not r.cancelled)
    )
    wall = time.perf_counter() - t_start
    out.stats = {
        **stats,
        "episodes": len(out),
        "cancelled": sum(r.cancelled for r in runs),
        "errors": sum("error" in r.info for r in runs),
        "reset_errors": [r.info["error"] for r in runs if r.t is None],
        "truncated": sum(r.truncated for r in runs),
        "mean_reward": sum(e.reward for e in out) / len(out) if out else 0.0,
        "generate_s": generate_s,
        "env_s": env_s,
        "wall_s": wall,
        "tokens_per_s": stats["generated_tokens"] / generate_s if generate_s > 0 else 0.0,
    }
    return out


def _begin(
    r: _Run, env: str | Callable[[], Any], env_kwargs: dict, agent: LLMAgent, seed: int
) -> None:
    t0 = time.perf_counter()
    try:
        r.env = _make_env(env, env_kwargs)
        obs, info = r.env.reset(seed=seed + r.index, options={"task_id": r.task_id})
    except Exception as e:  # noqa: BLE001  (one broken env must not end the batch)
        r.fail("reset", e)
        return
    finally:
        r.env_s += time.perf_counter() - t0
    r.info.update(info)
    r.t = agent.start(obs, r.task_id)  # a prompt over max_context is a setup error: raise


def _advance(r: _Run, end: TurnEnd, agent: LLMAgent) -> None:
    """Hand a finished turn's action to the env and append its answer."""
    if end.limit == "context":
        _context_full(r)
        return
    if end.limit == "turn" and agent.on_turn_budget == "truncate":
        r.finish(0.0, truncated=True, truncated_by=end.limit, success=False)
        return
    if not end.text:
        r.finish(0.0, empty_action=True, success=False)  # envs take at least one character
        return
    t0 = time.perf_counter()
    try:
        if end.limit == "turn":
            flag = getattr(r.env.unwrapped, "flag_action_truncated", None)
            if flag is not None:
                flag()
        obs, reward, terminated, truncated, info = r.env.step(end.text)
    except Exception as e:  # noqa: BLE001
        r.fail("step", e)
        return
    finally:
        r.env_s += time.perf_counter() - t0
    r.info.update(info)
    if terminated or truncated:
        r.finish(
            reward,
            truncated=bool(truncated and not terminated),
            truncated_by="env" if truncated else None,
        )
    elif not agent.add_feedback(r.t, obs):
        _context_full(r)


def _context_full(r: _Run) -> None:
    """The context window is full: the episode ends with the env's own terminal outcome
    (``TextEnv.end_episode``: AppWorld runs its evaluator on the world as it is), or as a
    failure for envs without one."""
    end = getattr(r.env.unwrapped, "end_episode", None)
    reward, info = 0.0, {"success": False}
    if end is not None:
        try:
            reward, info = end()
        except Exception as e:  # noqa: BLE001
            r.fail("end_episode", e)
            return
    r.info.update(info)
    r.finish(reward, truncated=True, truncated_by="context", success=bool(info.get("success")))


def _episode(r: _Run, env: str | Callable[[], Any]) -> Episode:
    t = r.t
    info = {
        **r.info,
        "actions": list(t.actions),
        "finish_reasons": list(t.finish_reasons),
        "timing": {"generate_s": r.generate_s, "env_s": r.env_s, "wall_s": r.end - r.start},
        "prompt_tokens": t.prompt_len,
    }
    return Episode(
        task_id=r.task_id,
        group_id=r.group_id,
        token_ids=list(t.token_ids),
        action_mask=list(t.action_mask),
        sampler_logprobs=list(t.logprobs),
        reward=r.reward,
        info=info,
        num_turns=t.num_turns,
        truncated=r.truncated,
        env_id=env if isinstance(env, str) else getattr(env, "__name__", ""),
    )
