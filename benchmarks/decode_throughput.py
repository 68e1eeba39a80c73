"""Tokens per second of the ``hf`` engine's two decode paths (``generate`` and ``static``) at
the demo's rollout shape, against this machine's roofline, in fp32 and bf16.

The workload: the demo's first ``--tasks`` arithmetic prompts, each ``--k`` times, sampled at
temperature 1 for ``--budget`` new tokens each (``ignore_eos``: equal work for both paths) in
one batch, with a non-zero LoRA adapter (the demo's rank 16, alpha 32, attention and MLP) of
which every repeat publishes a new version, as a training run does: each timed call loads (and,
for ``static``, merges) that version. A one-prompt warm-up call is not timed; there is no
``torch.compile`` to count. Reports the median of ``--repeats`` calls with the load average
after each (other jobs share the machine).

Roofline, per decode step of the batch (B rows, P weights in the body and LM head, L layers,
KV width W, mean context C)::

    flops = 2 * B * P + 4 * B * L * W * C        (weight matmuls; QK^T and AV)
    bytes = P * itemsize + 2 * B * L * W * C * itemsize      (weights; the KV cache)
    flop_bound = B / (flops / matmul_rate)        byte_bound = B / (bytes / read_rate)
    generation_roofline_fraction = tokens_per_s / min(flop_bound, byte_bound)

``matmul_rate``: best of a [B, hidden] x [hidden, intermediate] matmul in the dtype (the
decode step's own shape); ``read_rate``: best of summing a 1 GiB tensor. Prefill is in the
measured time but not in the bound, so the fraction is a lower bound.

    nice -n 0 .venv/bin/python benchmarks/decode_throughput.py
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from demo_workload import AGENT, demo_prompts
from jsonargparse import ArgumentParser

from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.models import resolve_model
from entrogym.train.policy import LoraSettings, load_policy, save_adapter


def best_seconds(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_rate(dtype: torch.dtype, rows: int, hidden: int, inner: int) -> float:
    """FLOP/s of [rows, hidden] x [hidden, inner], best of 20 timings of 50 products."""
    a, b = torch.randn(rows, hidden).to(dtype), torch.randn(hidden, inner).to(dtype)
    seconds = best_seconds(lambda: [a @ b for _ in range(50)], 20)
    return 2 * rows * hidden * inner * 50 / seconds


def read_rate() -> float:
    """Bytes/s of summing a 1 GiB fp32 tensor, best of 5."""
    big = torch.ones(2**28)
    return big.numel() * 4 / best_seconds(big.sum, 5)


def roofline(config, params: int, batch: int, context: float, dtype: torch.dtype) -> dict:
    """The bounds of the module docstring, in tokens/s."""
    size = torch.finfo(dtype).bits // 8
    width = config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    layers = config.num_hidden_layers
    flops = 2 * batch * params + 4 * batch * layers * width * context
    nbytes = params * size + 2 * batch * layers * width * context * size
    rate = matmul_rate(dtype, batch, config.hidden_size, config.intermediate_size)
    read = read_rate()
    return {
        "matmul_gflops": round(rate / 1e9, 1),
        "read_gb_s": round(read / 1e9, 1),
        "flop_bound_tokens_per_s": round(batch * rate / flops, 1),
        "byte_bound_tokens_per_s": round(batch * read / nbytes, 1),
    }


def publish(policy, folder: Path, version: int) -> str:
    """A new version of a non-zero adapter in ``folder`` (random B, as after an update)."""
    gen = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
    save_adapter(policy, folder)
    return str(folder)


def measure(decode: str, dtype: str, prompts, params, policy, folder: Path, args) -> dict:
    t0 = time.perf_counter()
    engine = make_engine(
        "hf", args.model, dtype=dtype, max_model_len=256, max_num_seqs=len(prompts), decode=decode
    )
    startup = time.perf_counter() - t0
    runs = []
    with engine:
        engine.generate(prompts[:1], SamplingParams(max_tokens=4))
        for rep in range(args.repeats):
            adapter = publish(policy, folder, rep + 1)
            t0 = time.perf_counter()
            out = engine.generate(prompts, params, adapter=adapter)
            seconds = time.perf_counter() - t0
            tokens = sum(len(c.token_ids) for c in out)
            runs.append(
                {
                    "tokens_per_s": round(tokens / seconds, 1),
                    "seconds": round(seconds, 2),
                    "load_average": [round(x, 2) for x in os.getloadavg()],
                }
            )
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
        "startup_s": round(startup, 1),
        "per_repeat": runs,
    }


def bf16_supported() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--model", default=AGENT.model)
    p.add_argument("--tasks", type=int, default=6)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--budget", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtypes", type=list[str], default=["fp32", "bf16"])
    p.add_argument("--decodes", type=list[str], default=["generate", "static"])
    args = p.parse_args(argv)
    agent, prompts = demo_prompts(args.model, args.tasks, args.k)
    params = SamplingParams(max_tokens=args.budget, temperature=1.0, ignore_eos=True)
    policy = load_policy(resolve_model(args.model), lora=LoraSettings())
    base = policy.get_base_model()
    embed = base.get_input_embeddings().weight
    n_params = sum(t.numel() for n, t in base.named_parameters() if "lora_" not in n)
    n_params -= 0 if base.config.tie_word_embeddings else embed.numel()  # lookup: no matmul
    context = statistics.mean(len(q) for q in prompts) + args.budget / 2
    result: dict = {
        "model": args.model,
        "prompts": len(prompts),
        "budget": args.budget,
        "torch_threads": torch.get_num_threads(),
        "bf16_supported": bf16_supported(),
        "roofline_params": n_params,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtypes:
            if dtype == "bf16" and not bf16_supported():
                continue
            torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
            row = {"roofline": roofline(base.config, n_params, len(prompts), context, torch_dtype)}
            bound = min(
                row["roofline"]["flop_bound_tokens_per_s"],
                row["roofline"]["byte_bound_tokens_per_s"],
            )
            for decode in args.decodes:
                row[decode] = measure(decode, dtype, prompts, params, policy, Path(tmp), args)
                row[decode]["generation_roofline_fraction"] = round(
                    row[decode]["tokens_per_s"] / bound, 3
                )
            if {"generate", "static"} <= row.keys():
                row["speedup"] = round(
                    row["static"]["tokens_per_s"] / row["generate"]["tokens_per_s"], 2
                )
            result[dtype] = row
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
