"""Replay a training run's rollouts with one fixed adapter: the same task draw per iteration,
the same env seeds and the run's own rollout settings (engine, decode, agent, turn budget).

Its question: did a run find no signal because its starting policy could not solve its tasks,
or because training moved the policy away from them? With the adapter the run started from,
iteration 0 replays the run's first row exactly (a fresh ``hf`` engine under the run's seed);
later iterations show what the unchanged start would have scored on the tasks the run drew.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/studies/replay_rollouts.py \\
        RUN --adapter START/checkpoints/iter-000014/adapter --iterations 20 --out replay.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import SamplingParams, check_adapter, make_engine
from entrogym.agents.rollout import collect_rollouts
from entrogym.models import resolve_model
from entrogym.train.config import TrainConfig
from entrogym.train.devices.distributed import Ranks
from entrogym.train.folder.layout import saved_config
from entrogym.train.sampler.engine import Sampler, iteration_seed
from entrogym.train.shutdown import ShutdownRequest


def run_config(run: Path) -> TrainConfig:
    """The run's rollout settings from its ``config.yaml`` (the algorithm is not needed)."""
    saved = saved_config(run)
    if not saved:
        raise ValueError(f"{run} has no config.yaml: pass a training run's folder")
    names = {f.name for f in dataclasses.fields(TrainConfig)} - {"algo"}
    return TrainConfig(**{k: v for k, v in saved.items() if k in names})


def replay(cfg: TrainConfig, adapter: str, iterations: int) -> list[dict[str, Any]]:
    """One row per iteration: its tasks, mean reward, completed episodes and mean turns."""
    engine = make_engine(cfg.engine, cfg.model, **cfg.engine_kwargs(
        seed=cfg.seed, lora_rank=cfg.lora_rank, max_num_seqs=cfg.tasks_per_iter * cfg.samples,
        threads=cfg.threads))  # fmt: skip
    # the run's own sampler gives the task draw, env kwargs and turn-budget rule; envs in this
    # process (no worker pool), and nothing is written to the run's folder
    sampler = Sampler(dataclasses.replace(cfg, env_workers=0), Ranks(), ShutdownRequest(0), engine)
    agent = LLMAgent.from_model(cfg.model, **{**cfg.agent_kwargs(),
                                               "on_turn_budget": sampler.on_turn_budget})  # fmt: skip
    rows = []
    try:
        for it in range(iterations):
            drawn = sampler.tasks_of(it)
            episodes = list(collect_rollouts(
                cfg.env, drawn, engine, agent, k=cfg.samples,
                sampling=SamplingParams(temperature=cfg.temperature), adapter=adapter,
                min_done_per_task=cfg.early_stop_min_per_task,
                min_done_fraction=cfg.early_stop_fraction, env_kwargs=sampler.env_kwargs,
                # the env seeds of Sampler.rollouts
                seed=iteration_seed(cfg.seed, it * cfg.tasks_per_iter * cfg.samples),
                env_workers=0, turn_rewards=cfg.turn_rewards,
            ))  # fmt: skip
            rows.append({
                "iteration": it, "tasks": drawn,
                "reward_mean": sum(e.reward for e in episodes) / len(episodes),
                "successes": sum(bool(e.info.get("success")) for e in episodes),
                "episodes": len(episodes),
                "turns_mean": sum(e.num_turns for e in episodes) / len(episodes),
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    finally:
        engine.close()
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="the training run's folder (its config.yaml)")
    p.add_argument("--adapter", required=True, help="the fixed LoRA adapter to roll out")
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--out", default=None, help="write the rows here as JSON lines")
    args = p.parse_args(argv)
    try:
        cfg = run_config(args.run)
        adapter = check_adapter(args.adapter, resolve_model(cfg.model))
    except (ValueError, TypeError) as e:
        p.error(str(e))
    rows = replay(cfg, adapter, args.iterations)
    total = sum(r["successes"] for r in rows)
    print(f"completed {total} of {sum(r['episodes'] for r in rows)} episodes", flush=True)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


if __name__ == "__main__":
    main()
