"""Collect K rollouts per arithmetic task with SmolLM2-135M-Instruct and print rewards and the
sampler/trainer mismatch, through in-process vLLM and through a local ``vllm serve``.

    .venv/bin/python examples/collect_rollouts.py                       # both engines, bf16
    .venv/bin/python examples/collect_rollouts.py --engines vllm --dtypes bf16 fp32
    .venv/bin/python examples/collect_rollouts.py --engines hf --model tiny-random-llama

Prints one JSON line per (engine, dtype) run.
"""

from __future__ import annotations

import json
import os
import time

from jsonargparse import ArgumentParser

# Keep vLLM's start-up chatter out of the JSON output (errors still show).
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import entrogym  # noqa: F401  (registers the envs)
from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import ENGINE_KINDS, SamplingParams, make_engine
from entrogym.agents.rollout import collect_rollouts
from entrogym.envs.base import make_text_env, task_ids_of
from entrogym.train.learner.mismatch import episodes_mismatch
from entrogym.train.learner.policy import load_base_model

SYSTEM = "You are a careful calculator. Answer with the final number in \\boxed{}."


def parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--config", action="config")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--env", default="entrogym/Arithmetic-v0")
    p.add_argument("--split", default="train")
    p.add_argument("--tasks", type=int, default=4, help="number of tasks")
    p.add_argument("--k", type=int, default=6, help="samples per task")
    p.add_argument("--engines", type=list[str], default=["vllm", "vllm-server"])
    p.add_argument("--dtypes", type=list[str], default=["bf16"])
    p.add_argument("--max_turn_tokens", type=int, default=128)
    p.add_argument("--max_context", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--adapter", type=str | None, default=None, help="LoRA adapter folder")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for kind in args.engines:
        if kind not in ENGINE_KINDS:
            raise ValueError(f"--engines takes {list(ENGINE_KINDS)}, got {kind!r}")
    env = make_text_env(args.env)
    tasks = task_ids_of(env, args.split)[: args.tasks]
    env.close()
    agent = LLMAgent.from_model(
        args.model,
        system_prompt=SYSTEM,
        max_turn_tokens=args.max_turn_tokens,
        max_context=args.max_context,
    )
    trainer = load_base_model(args.model, dtype="fp32").eval()
    if args.adapter:
        from entrogym.train.learner.policy import load_adapter

        trainer = load_adapter(trainer, args.adapter, trainable=False).eval()
    for kind in args.engines:
        for dtype in args.dtypes:
            t0 = time.perf_counter()
            engine = make_engine(
                kind, args.model, dtype=dtype, max_model_len=args.max_context, seed=args.seed
            )
            startup = time.perf_counter() - t0
            try:
                episodes = collect_rollouts(
                    args.env,
                    tasks,
                    engine,
                    agent,
                    k=args.k,
                    adapter=args.adapter,
                    sampling=SamplingParams(temperature=args.temperature),
                    seed=args.seed,
                )
            finally:
                engine.close()
            rewards = {t: [e.reward for e in episodes if e.task_id == t] for t in tasks}
            report = {
                "engine": kind,
                "dtype": dtype,
                "model": args.model,
                "startup_s": round(startup, 1),
                "rewards": rewards,
                "mean_reward": episodes.stats["mean_reward"],
                "episodes": len(episodes),
                "cancelled": episodes.stats["cancelled"],
                "truncated": episodes.stats["truncated"],
                "tokens_per_s": round(episodes.stats["tokens_per_s"], 1),
                "mismatch_vs_fp32_trainer": episodes_mismatch(trainer, episodes),
                "example": agent.tokenizer.decode(
                    episodes[0].token_ids[episodes[0].info["prompt_tokens"] :]
                ),
            }
            print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":  # vLLM starts worker processes: the guard is required
    raise SystemExit(main())
