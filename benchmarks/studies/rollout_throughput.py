"""Generated tokens per second, start-up and peak RSS of the ``vllm`` and ``hf`` engines on
the demo's rollout shapes.

The prompts are the demo's (``demo_workload.py``): the chat-formatted first observations of
``--tasks`` arithmetic tasks with the demo's system prompt, each repeated ``--k`` times and
sampled at temperature 1 with a ``--budget``-token limit in one batch (as one lockstep rollout
turn is), with the engine settings the demo uses (``AGENT.engine_kwargs()``: fp32, 256-token
context). A one-prompt warm-up call is excluded from the timing.

    nice -n 10 .venv/bin/python benchmarks/studies/rollout_throughput.py --engines '[hf]'
    nice -n 10 .venv/bin/python benchmarks/studies/rollout_throughput.py --engines '[vllm]'

Give each engine its own process (as above) so that ``peak_rss_mb`` (this process and all its
children, sampled every 0.2 s from start-up to close) covers that engine alone. Prints JSON
with the load average before and after each engine.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

from jsonargparse import ArgumentParser

# Keep vLLM's start-up chatter out of the JSON output (errors still show).
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_common import PeakRss  # noqa: E402
from demo_workload import AGENT, demo_agent, demo_prompts  # noqa: E402

import entrogym  # noqa: E402, F401
from entrogym.agents.engines import SamplingParams, make_engine  # noqa: E402


def measure(kind: str, prompts: list[list[int]], params: SamplingParams, args) -> dict:
    load_before = os.getloadavg()
    rss = PeakRss(os.getpid())
    t0 = time.perf_counter()
    agent = demo_agent(kind)  # the demo's settings; the decode path is the hf engine's only
    kwargs = agent.engine_kwargs(max_num_seqs=len(prompts), threads=args.threads)
    engine = make_engine(kind, args.model, **{**kwargs, "dtype": args.dtype})
    startup = time.perf_counter() - t0
    settings = {
        key: getattr(engine, key)
        for key in ("threads", "max_num_seqs", "kv_cache_bytes", "env")
        if hasattr(engine, key)
    }
    try:
        engine.generate(prompts[:1], SamplingParams(max_tokens=4))
        runs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = engine.generate(prompts, params)
            seconds = time.perf_counter() - t0
            tokens = sum(len(c.token_ids) for c in out)
            runs.append({"tokens": tokens, "seconds": round(seconds, 3)})
    finally:
        engine.close()
        peak = rss.stop()
    tokens, seconds = sum(r["tokens"] for r in runs), sum(r["seconds"] for r in runs)
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 2),
        "per_repeat": runs,
        "startup_s": round(startup, 1),
        "peak_rss_mb": round(peak),
        "engine_settings": settings,
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--model", default=AGENT.model)
    p.add_argument("--tasks", type=int, default=6)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--budget", type=int, default=AGENT.max_response_tokens)
    p.add_argument("--dtype", default=AGENT.engine_dtype)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--engines", type=list[str], default=["vllm", "hf"])
    p.add_argument(
        "--threads",
        type=int | None,
        default=None,
        help="torch threads, and the vllm worker's bound cores (None: the defaults: torch's "
        "thread count; every core for vllm)",
    )
    args = p.parse_args(argv)
    if args.threads is not None:  # also OMP_NUM_THREADS for the engine's child processes
        from entrogym.train.devices.precision import apply_threads

        apply_threads(args.threads)
    agent, prompts = demo_prompts(args.model, args.tasks, args.k)
    params = SamplingParams(
        max_tokens=args.budget, temperature=1.0, stop_token_ids=agent.stop_token_ids
    )
    result = {
        "model": args.model,
        "dtype": args.dtype,
        "prompts": len(prompts),
        "budget": args.budget,
        "torch_threads": __import__("torch").get_num_threads(),
        "env": {
            key: os.environ.get(key)
            for key in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE")
        },
        "machine": f"{platform.machine()} {platform.processor()}".strip(),
    }
    for kind in args.engines:
        result[kind] = measure(kind, prompts, params, args)
    if "vllm" in result and "hf" in result:
        result["ratio_vllm_over_hf"] = round(
            result["vllm"]["tokens_per_s"] / result["hf"]["tokens_per_s"], 2
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":  # vLLM starts worker processes: the guard is required
    raise SystemExit(main())
