"""Multi-turn rollouts of the ``hf`` engine: the cache kept across turns and env steps beside
generation, each against its absence, on one workload.

The workload: ``--tasks`` x ``--samples`` conversations of the ``multiturn_env:Talk-v0`` env
(``--turns`` turns, each env step taking ``--latency-ms``, envs in env worker processes), the
agent's turns up to ``--turn-tokens`` tokens. With ``--stop-ids N`` a turn also ends at any of
N token ids (spread over the vocabulary), so that turns of a tiny random model end at
different points as a real model's do. Modes:

- ``full``: every turn's prompt prefilled whole (``keep_cache=False``), envs stepped after
  each call (``overlap_env=False``): the loop without either;
- ``kept``: the cache kept across turns, envs after each call;
- ``chunked``: the cache kept, turns generated in chunks of ``--chunk-tokens``, envs after
  each call;
- ``overlap``: as ``chunked``, with envs stepped beside the next call (the overlap needs turns
  that end in different calls, which chunks give).

Each repetition runs every (mode, turns, latency) cell once, in a rotating order (interleaved);
the report gives each cell's median over ``--reps`` with the load average each ran at, and
generation tokens/s (generated tokens over the seconds inside ``generate``) per turn count.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/multiturn_rollout.py \\
        --turns 1 2 4 8 --latency-ms 0 100 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# the env worker processes import multiturn_env from here
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))

import multiturn_env  # noqa: E402, F401  (registers Talk-v0 here too)
from host_features import host_features  # noqa: E402

from entrogym.agents.agent import LLMAgent  # noqa: E402
from entrogym.agents.engines import SamplingParams, make_engine  # noqa: E402
from entrogym.agents.rollout import collect_rollouts  # noqa: E402
from entrogym.models import resolve_model  # noqa: E402

MODES = ("full", "kept", "chunked", "overlap")


def run_cell(args: argparse.Namespace, mode: str, turns: int, latency: float) -> dict:
    model = resolve_model(args.model)
    stops = tuple(range(1000, 1000 + args.stop_ids))
    agent = LLMAgent.from_model(
        model, max_turn_tokens=args.turn_tokens, max_context=args.context,
        on_turn_budget="step", stop_token_ids=stops,
    )  # fmt: skip
    engine = make_engine(
        "hf", model, dtype="fp32", max_model_len=args.context, decode="static-cdf",
        keep_cache=mode != "full", max_num_seqs=args.tasks * args.samples,
    )  # fmt: skip
    load = os.getloadavg()[0]
    with engine, engine.seeded(args.seed):
        engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2))  # warm: kernels, merge
        t0 = time.perf_counter()
        out = collect_rollouts(
            "multiturn_env:Talk-v0", [f"talk-{i}" for i in range(args.tasks)], engine, agent,
            k=args.samples, early_stop=False, seed=args.seed,
            env_kwargs={"turns": turns, "latency_ms": latency},
            chunk_tokens=args.chunk_tokens if mode in ("chunked", "overlap") else None,
            overlap_env=mode == "overlap", env_workers=args.env_workers,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        kept = engine.kept_cache_stats
    s = out.stats
    return {
        "mode": mode, "turns": turns, "latency_ms": latency, "wall_s": wall,
        "generate_s": s["generate_s"], "env_wait_s": s["env_s"],
        "generated_tokens": s["generated_tokens"], "generate_calls": s["generate_calls"],
        "tokens_per_s": s["tokens_per_s"], "mean_turns": statistics.mean(e.num_turns for e in out),
        "reused_tokens": kept["reused_tokens"], "load_1min": load,
    }  # fmt: skip


def summary(rows: list[dict]) -> list[dict]:
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        cells.setdefault((row["mode"], row["turns"], row["latency_ms"]), []).append(row)
    out = []
    for (mode, turns, latency), runs in sorted(cells.items()):
        med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "generate_s",
               "env_wait_s", "tokens_per_s", "generated_tokens", "generate_calls")}  # fmt: skip
        med["loads"] = [round(r["load_1min"], 2) for r in runs]
        out.append({"mode": mode, "turns": turns, "latency_ms": latency, **med})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-random-llama")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--turns", nargs="+", type=int, default=[1, 2, 4, 8])
    p.add_argument("--latency-ms", nargs="+", type=float, default=[0.0, 100.0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--samples", type=int, default=6)
    p.add_argument("--turn-tokens", type=int, default=32)
    p.add_argument("--chunk-tokens", type=int, default=8)
    p.add_argument("--stop-ids", type=int, default=0)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--env-workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    cells = [(m, t, lat) for m in args.modes for t in args.turns for lat in args.latency_ms]
    rows: list[dict] = []
    for rep in range(args.reps):
        shift = rep % len(cells)
        for mode, turns, latency in cells[shift:] + cells[:shift]:
            row = run_cell(args, mode, turns, latency)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if args.out:  # after every run: a run cut short keeps what it measured
                args.out.write_text(json.dumps(report(args, rows), indent=1))
    print(json.dumps(report(args, rows), indent=1))


def report(args: argparse.Namespace, rows: list[dict]) -> dict:
    return {"host": host_features(), "args": {k: str(v) for k, v in vars(args).items()},
            "cells": summary(rows), "runs": rows}  # fmt: skip


if __name__ == "__main__":
    main()
