"""MKL's sgemm (torch's CPU matmul) against oneDNN's linear kernel (``entrogym.onednn``) at
the shapes entrogym computes, with this process's threads: what ``docs/performance.md``
("oneDNN's kernel on CPU") rests on.

Rows (GFLOP/s, best of ``--reps``; errors are the largest absolute difference from a float64
product of the same inputs):

- ``decode_step``: one decode step's projections of SmolLM2 (30 layers of q|k|v, o, gate|up
  and down, then the LM head) at 24 rows, every layer its own weights, so that they stream
  from memory as in a real step; sgemm input-major (``x @ w``), output-major (``w @ x.T``)
  and ``F.linear``, against oneDNN over packed weights, and in fp32 the ``hf`` engine's own
  streaming kernel (``decode_kernel.linear``, where it runs: AVX-512); fp32 and bf16.
- ``hot``: the roofline's ceiling shape, [24, 576] x [576, 1536], the same weight every call
  (the decoder's kernel too, in fp32).
- ``learner_forward`` / ``learner_input_grad``: the learner's projections at 2,328 rows
  (24 sequences of 97 tokens), forward and the input's gradient (oneDNN over ``weight.T``,
  copied per call as ``FrozenLinear`` does).
- ``error``: fp32 products against float64.

    .venv/bin/python benchmarks/studies/onednn_kernels.py > benchmarks/results/onednn-kernels.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

from entrogym import onednn
from entrogym.agents.engines import decode_kernel


def decoder_linear(x: torch.Tensor, packed: tuple[torch.Tensor, int]) -> torch.Tensor:
    """``x @ w.T`` by the decoder's streaming kernel; ``packed`` = (packed weight, out)."""
    return decode_kernel.linear(x, packed[0], packed[1])


def decoder_pack(w: torch.Tensor) -> tuple[torch.Tensor, int]:
    return decode_kernel.linear_pack(w), w.shape[0]


LAYER = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # (in, out): qkv, o, gate|up, down
LAYERS, VOCAB, HIDDEN = 30, 49152, 576


def best(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def decode_step(dtype: torch.dtype, rows: int, reps: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    weights = [[(torch.randn(o, i, generator=gen) * 0.02).to(dtype) for i, o in LAYER]
               for _ in range(LAYERS)]  # fmt: skip
    head = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02).to(dtype)
    xs = {i: torch.randn(rows, i, generator=gen).to(dtype) for i in (576, 1536)}
    flops = 2 * rows * (LAYERS * sum(i * o for i, o in LAYER) + VOCAB * HIDDEN)

    def step(project, weights, head):
        for layer in weights:
            for (i, _), w in zip(LAYER, layer, strict=True):
                project(xs[i], w)
        project(xs[576], head)

    variants = {
        "sgemm x @ w (input-major)": (lambda x, w: x @ w, lambda w: w.t().contiguous()),
        "sgemm w @ x.T (output-major)": (lambda x, w: w @ x.t(), lambda w: w),
        "sgemm F.linear": (F.linear, lambda w: w),
    }
    if onednn.supported(torch.device("cpu"), dtype):
        variants["onednn packed"] = (onednn.linear, onednn.pack)
    if dtype == torch.float32 and decode_kernel.linear_supported():
        variants["decoder kernel"] = (decoder_linear, decoder_pack)
    out = {}
    for name, (project, layout) in variants.items():
        laid = [[layout(w) for w in layer] for layer in weights]
        laid_head = layout(head)
        seconds = best(lambda p=project, w=laid, h=laid_head: step(p, w, h), reps)
        out[name] = {"ms": round(seconds * 1e3, 1), "gflops": round(flops / seconds / 1e9)}
    return out


def rate(fn, flops: float, reps: int) -> int:
    return round(flops / best(fn, reps) / 1e9)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    cpu = torch.device("cpu")
    if not onednn.supported(cpu, torch.float32):
        raise SystemExit("this torch build has no oneDNN: nothing to compare")
    result: dict = {"threads": torch.get_num_threads(), "load_1min": os.getloadavg()[0]}
    result["decode_step"] = {
        name: decode_step(dtype, 24, args.reps)
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
        if onednn.supported(cpu, dtype)
    }
    result["hot"] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x, w = torch.randn(24, 576).to(dtype), torch.randn(1536, 576).to(dtype)
        wt, packed = w.t().contiguous(), onednn.pack(w)
        flops = 2 * 24 * 576 * 1536 * 50
        result["hot"][name] = {
            "sgemm": rate(lambda: [x @ wt for _ in range(50)], flops, 20),  # noqa: B023
            "onednn packed": rate(lambda: [onednn.linear(x, packed) for _ in range(50)], flops, 20),  # noqa: B023
        }
        if dtype == torch.float32 and decode_kernel.linear_supported():
            own = decoder_pack(w)
            result["hot"][name]["decoder kernel"] = rate(
                lambda: [decoder_linear(x, own) for _ in range(50)],  # noqa: B023
                flops,
                20,
            )
    rows = 24 * 97
    result["learner_forward"], result["learner_input_grad"], result["error"] = {}, {}, {}
    gen = torch.Generator().manual_seed(1)
    for i, o in LAYER:
        key = f"{i}x{o}"
        x, w = torch.randn(rows, i, generator=gen), torch.randn(o, i, generator=gen) * 0.05
        grad = torch.randn(rows, o, generator=gen)
        flops = 2 * rows * i * o
        result["learner_forward"][key] = {
            "sgemm F.linear": rate(lambda: F.linear(x, w), flops, 5),  # noqa: B023
            "onednn": rate(lambda: onednn.linear(x, w), flops, 5),  # noqa: B023
        }
        result["learner_input_grad"][key] = {
            "sgemm grad @ w": rate(lambda: grad @ w, flops, 5),  # noqa: B023
            "onednn, w.T copied": rate(lambda: onednn.linear(grad, w.t().contiguous()), flops, 5),  # noqa: B023
        }
        exact = x.double() @ w.double().T
        result["error"][key] = {
            "scale": round(exact.abs().max().item(), 2),
            "sgemm": (F.linear(x, w).double() - exact).abs().max().item(),
            "onednn": (onednn.linear(x, w).double() - exact).abs().max().item(),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
