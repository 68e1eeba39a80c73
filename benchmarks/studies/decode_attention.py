"""One decode step's attention at SmolLM2's decode shape: the static decoder's C++ kernel
(``entrogym.agents.engines.decode_kernel``) against torch's two ways (``step_attention``: two
matmuls and a softmax; ``scaled_dot_product_attention``), per dtype.

The shape: ``--rows`` rows (the rollout batch) x 3 kv heads x 3 query rows per kv head, 64-wide
heads, ``--keys`` keys attended (prompt plus the tokens so far), in a cache of ``--columns``.
Each way is timed in turn, ``--calls`` calls per timing, ``--repeats`` timings, interleaved so
that a change of the host's speed reaches all of them alike; reports the median wall time and
the median thread CPU time per call (the CPU time of the calling thread, which other jobs on the
machine do not inflate; with more than one thread it misses the pool's other threads, so it is
given for ``--threads 1`` only), with the 1-minute load average.

    .venv/bin/python benchmarks/studies/decode_attention.py --threads 2 --out runs/decode-attention.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from entrogym.agents.engines import decode_kernel
from entrogym.agents.engines.static_decode import sdpa_step, step_attention


def inputs(rows: int, keys: int, columns: int, dtype: torch.dtype, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    groups, per_group, dim = 3, 3, 64
    q = torch.randn(rows, groups, per_group, dim, generator=gen).to(dtype)
    k = torch.randn(rows, groups, columns, dim, generator=gen).to(dtype)
    v = torch.randn(rows, groups, columns, dim, generator=gen).to(dtype)
    valid = torch.ones(rows, columns, dtype=torch.bool)
    valid[::2, :7] = False  # left padding on half the rows
    return {"q": q, "k": k, "k_t": k.transpose(-1, -2).contiguous(), "v": v, "valid": valid}


def ways(x: dict, keys: int) -> dict:
    mask = x["valid"][:, None, None, :keys]
    k, v = x["k"][:, :, :keys], x["v"][:, :, :keys]
    return {
        "kernel": lambda: decode_kernel.attention(x["q"], x["k_t"], x["v"], x["valid"], keys),
        "two_matmuls": lambda: step_attention(x["q"], k, v, mask),
        "sdpa": lambda: sdpa_step(x["q"], k, v, mask),
    }


def time_ways(fns: dict, calls: int, repeats: int) -> dict:
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in fns.items():
            w, c = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                fn()
            cpu[name].append((time.thread_time() - c) / calls * 1e6)
            wall[name].append((time.perf_counter() - w) / calls * 1e6)
    return {
        name: {
            "wall_us": round(statistics.median(wall[name]), 1),
            "thread_cpu_us": round(statistics.median(cpu[name]), 1),
        }
        for name in fns
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=24)
    p.add_argument("--keys", type=int, default=110)
    p.add_argument("--columns", type=int, default=160)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not 1 <= args.keys <= args.columns:
        p.error("--keys must be between 1 and --columns")
    if decode_kernel.module() is None:
        print(
            "decode_attention.py: the kernel did not build (see the warning above)", file=sys.stderr
        )
        return 1
    torch.set_num_threads(args.threads)
    result = {"shape": vars(args) | {"out": None}, "rows": {}}
    for dtype in (torch.float32, torch.bfloat16):
        x = inputs(args.rows, args.keys, args.columns, dtype)
        result["rows"][str(dtype).removeprefix("torch.")] = time_ways(
            ways(x, args.keys), args.calls, args.repeats
        )
    result["load_1min"] = os.getloadavg()[0]
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
