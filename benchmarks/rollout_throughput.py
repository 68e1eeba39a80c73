"""Generated tokens per second of the ``vllm`` and ``hf`` engines on the same prompts.

The prompts are the chat-formatted first observations of ``--tasks`` arithmetic tasks, each
repeated ``--k`` times and sampled with a ``--budget``-token limit in one batch (as one
lockstep rollout turn is). A one-prompt warm-up call is excluded from the timing.

    .venv/bin/python benchmarks/rollout_throughput.py --model smollm2-135m-instruct

Prints JSON with both figures and their ratio.
"""

from __future__ import annotations

import json
import os
import platform
import time

from jsonargparse import ArgumentParser

# Keep vLLM's start-up chatter out of the JSON output (errors still show).
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import entrogym  # noqa: F401
from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.envs.base import make_text_env, task_ids_of


def measure(kind: str, model: str, prompts: list[list[int]], params: SamplingParams, args) -> dict:
    t0 = time.perf_counter()
    engine = make_engine(kind, model, dtype=args.dtype, max_model_len=args.max_model_len, seed=0)
    startup = time.perf_counter() - t0
    try:
        engine.generate(prompts[:1], SamplingParams(max_tokens=4))
        tokens, seconds = 0, 0.0
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = engine.generate(prompts, params)
            seconds += time.perf_counter() - t0
            tokens += sum(len(c.token_ids) for c in out)
    finally:
        engine.close()
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 2),
        "startup_s": round(startup, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--k", type=int, default=6)
    p.add_argument("--budget", type=int, default=128)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--max_model_len", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--engines", type=list[str], default=["vllm", "hf"])
    args = p.parse_args(argv)
    env = make_text_env("entrogym/Arithmetic-v0")
    agent = LLMAgent.from_model(args.model, max_context=args.max_model_len)
    prompts = []
    for task in task_ids_of(env, "train")[: args.tasks]:
        obs, _ = env.reset(options={"task_id": task})
        prompts += [agent.start(obs).token_ids] * args.k
    env.close()
    params = SamplingParams(
        max_tokens=args.budget, temperature=1.0, stop_token_ids=agent.stop_token_ids
    )
    result = {
        "model": args.model,
        "dtype": args.dtype,
        "prompts": len(prompts),
        "budget": args.budget,
        "machine": f"{platform.machine()} {platform.processor()}".strip(),
    }
    for kind in args.engines:
        result[kind] = measure(kind, args.model, prompts, params, args)
    if "vllm" in result and "hf" in result:
        result["ratio_vllm_over_hf"] = round(
            result["vllm"]["tokens_per_s"] / result["hf"]["tokens_per_s"], 2
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":  # vLLM starts worker processes: the guard is required
    raise SystemExit(main())
