"""GFLOP/s of a decode step's matmuls in four layouts the static decode path could use:
``F.linear(x, w)`` with ``w`` [out, in] (the model's own layout) against ``x @ w_t``
with ``w_t`` [in, out] contiguous (``sampling_copy.input_major``), the LM head as
``(head @ x.T).T`` (the left factor, no transposed copy of a tied embedding), and MKL's packed
sgemm (``torch.ops.mkl._mkl_linear`` on a weight reordered for the batch size).

Shapes: SmolLM2-135M's projections (q|k|v, o, gate|up, down, head) at ``--rows`` rows (a
decode step's batch; the learner's micro-batches have hundreds to thousands). Each number is
the median of ``--repeats`` timed blocks of ``--calls`` calls, the layouts interleaved, with
the load average after each block. The decoder stores input-major and takes the head as the
left factor; gate|up as the left factor, fastest here alone, made whole decode steps slower
(docs/results.md), so a layout is chosen by ``decode_throughput.py``, not by this alone.

    .venv/bin/python benchmarks/studies/matmul_layout.py --rows '[24, 96]' --threads 2
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from jsonargparse import ArgumentParser

# The shared benchmark modules (demo_workload.py, roofline.py, ...) sit one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from roofline import best_seconds  # noqa: E402

# (name, out, in) of SmolLM2-135M's matmuls: hidden 576, 3 KV heads x 64, intermediate 1536
SHAPES = [
    ("qkv", 960, 576),
    ("o", 576, 576),
    ("gate_up", 3072, 576),
    ("down", 576, 1536),
    ("head", 49152, 576),
]


def timed(call: Callable[[], torch.Tensor], calls: int) -> float:
    """Seconds per call over one block of ``calls`` calls, after an untimed block."""
    return best_seconds(lambda: [call() for _ in range(calls)], 1) / calls


def layouts(x: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    w_t = w.t().contiguous()
    runs = {
        "linear": lambda: F.linear(x, w),
        "input_major": lambda: x @ w_t,
        "left_factor": lambda: (w @ x.T).T,
    }
    if torch.backends.mkl.is_available():  # torch builds without MKL (e.g. on ARM) lack the ops
        # MKL's packed sgemm (cblas_sgemm_pack), as inductor's frozen fp32 linear calls it: the
        # weight reordered once for this batch size
        rows = x.shape[0]
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
        runs["mkl_packed"] = lambda: torch.ops.mkl._mkl_linear(x, packed, w, None, rows)
    return runs


def main() -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=list[int], default=[24, 96])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out: dict = {"threads": args.threads, "repeats": args.repeats, "calls": args.calls}
    for rows in args.rows:
        for name, n_out, n_in in SHAPES:
            x, w = torch.randn(rows, n_in), torch.randn(n_out, n_in)
            flops = 2 * rows * n_out * n_in
            runs = layouts(x, w)
            seconds: dict[str, list[float]] = {k: [] for k in runs}
            loads = []
            for _ in range(args.repeats):
                for k, call in runs.items():
                    seconds[k].append(timed(call, args.calls))
                loads.append(round(os.getloadavg()[0], 2))
            row = {k: round(flops / statistics.median(v) / 1e9, 1) for k, v in seconds.items()}
            out[f"{rows}x{name}"] = {"gflops": row, "load_1min": loads}
            print(rows, name, row, "load", loads[-1], flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
