"""Tokens per second of the ``hf`` engine's decode paths (``generate``, ``static`` and
``static-cdf``) at the demo's rollout shape, against this machine's roofline, in fp32 and bf16.

The workload: the demo's first ``--tasks`` arithmetic prompts, each ``--k`` times, sampled at
temperature 1 for ``--budget`` new tokens each (``ignore_eos``: equal work for both paths) in
one batch, with a non-zero LoRA adapter (the demo's rank 16, alpha 32, attention and MLP) of
which every repeat publishes a new version, as a training run does: each timed call loads (and,
for ``static``, merges) that version. A one-prompt warm-up call is not timed; there is no
``torch.compile`` to count. Reports the median of ``--repeats`` calls with the load average
after each (other jobs share the machine).

The roofline (``roofline.py``): a decode step's FLOPs and bytes at the batch and its mean
context, the matmul rate of the step's own shape and the read bandwidth, measured here per
dtype; ``generation_roofline_fraction`` is tokens/s over the lower bound. Prefill is in the
measured time but not in the bound, so the fraction is a lower bound.

``--paired``: every (dtype, decode) engine is loaded first, and each repeat publishes one
adapter version that every engine then samples, in an order rotated from repeat to repeat. Each
path's speedup is then the median over repeats of its tokens/s over fp32 ``generate``'s *in the
same repeat* (``paired_speedup``, with its range), so that a shift of the host's speed between
one path's calls and another's (10-20 % between runs here) cancels instead of entering the
ratio.

A decode path named ``PATH+torch-ops`` (``static-cdf+torch-ops``) is PATH with the static
decoder's C++ kernels turned off for its calls (``ENTROGYM_DECODE_KERNEL=0``: torch's ops and
oneDNN's linear kernel), to measure what the kernels buy in the same run; ``PATH+no-shared-prefix``
is PATH with every distinct prompt prefilled whole (no prompt opening prefilled once). The
suffixes combine.

    nice -n 0 .venv/bin/python benchmarks/decode_throughput.py [--paired --repeats 7]
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
from demo_workload import AGENT, demo_prompts
from jsonargparse import ArgumentParser
from roofline import DecodeShape, bounds, measure_rates, roofline_fraction, timed_generation

from entrogym.agents.engines import SamplingParams, make_engine, static_decode
from entrogym.dtypes import cpu_has_native
from entrogym.dtypes import torch_dtype as torch_dtype_of
from entrogym.models import resolve_model
from entrogym.train.learner.policy import LoraSettings, load_policy, save_adapter


def publish(policy, folder: Path, version: int) -> str:
    """A new version of a non-zero adapter in ``folder`` (random B, as after an update)."""
    gen = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
    save_adapter(policy, folder)
    return str(folder)


TORCH_OPS = "+torch-ops"
NO_SHARED_PREFIX = "+no-shared-prefix"


def base_decode(decode: str) -> str:
    """The engine's decode path of a benchmark path (``static-cdf+torch-ops``:
    ``static-cdf``)."""
    return decode.split("+", 1)[0]


def path_engine(decode: str, dtype: str, prompts, args):
    """The ``hf`` engine of one decode path and sampler dtype, sized to the batch."""
    return make_engine(
        "hf",
        args.model,
        dtype=dtype,
        max_model_len=256,
        max_num_seqs=len(prompts),
        decode=base_decode(decode),
    )


def path_scope(decode: str) -> contextlib.AbstractContextManager:
    """The scope of one call of path ``decode``: the C++ kernels off for a ``+torch-ops`` path
    (the decoder reads the switch when it merges a new version), and
    every prompt prefilled whole for a ``+no-shared-prefix`` path."""
    scope = contextlib.ExitStack()
    if TORCH_OPS in decode:
        scope.enter_context(mock.patch.dict(os.environ, {"ENTROGYM_DECODE_KERNEL": "0"}))
    if NO_SHARED_PREFIX in decode:
        scope.enter_context(mock.patch.object(static_decode, "shared_prefix", return_value=0))
    return scope


def measure(decode: str, dtype: str, prompts, params, policy, folder: Path, args) -> dict:
    t0 = time.perf_counter()
    engine = path_engine(decode, dtype, prompts, args)
    startup = time.perf_counter() - t0
    runs = []
    with engine, path_scope(decode):
        engine.generate(prompts[:1], SamplingParams(max_tokens=4))
        for rep in range(args.repeats):
            adapter = publish(policy, folder, rep + 1)
            runs.append(timed_generation(engine, prompts, params, adapter))
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
        "startup_s": round(startup, 1),
        "per_repeat": runs,
    }


def paired(dtypes: list[str], prompts, params, policy, folder: Path, args) -> dict:
    """Every (dtype, decode) path on one adapter version per repeat, in a rotated order; the
    per-repeat ratios to fp32 ``generate`` (module docstring, ``--paired``)."""
    arms = [(dtype, decode) for dtype in dtypes for decode in args.decodes]
    engines = {(dtype, decode): path_engine(decode, dtype, prompts, args) for dtype, decode in arms}
    runs: dict[tuple[str, str], list[dict]] = {arm: [] for arm in arms}
    try:
        for (_, decode), engine in engines.items():
            with path_scope(decode):
                engine.generate(prompts[:1], SamplingParams(max_tokens=4))
        for rep in range(args.repeats):
            adapter = publish(policy, folder, rep + 1)
            shift = rep % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                with path_scope(arm[1]):
                    runs[arm].append(timed_generation(engines[arm], prompts, params, adapter))
    finally:
        for engine in engines.values():
            engine.close()
    rows: dict = {}
    base = runs.get(("fp32", "generate"))
    for (dtype, decode), reps in runs.items():
        row = rows.setdefault(dtype, {})
        row[decode] = {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in reps),
            "per_repeat": reps,
        }
        if base is not None and (dtype, decode) != ("fp32", "generate"):
            ratios = [
                r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(reps, base, strict=True)
            ]
            row.setdefault("paired_speedup", {})[decode] = {
                "median": round(statistics.median(ratios), 2),
                "min": round(min(ratios), 2),
                "max": round(max(ratios), 2),
                "per_repeat": [round(x, 2) for x in ratios],
            }
    return rows


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--model", default=AGENT.model)
    p.add_argument("--tasks", type=int, default=6)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--budget", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtypes", type=list[str], default=["fp32", "bf16"])
    p.add_argument("--decodes", type=list[str], default=["generate", "static", "static-cdf"])
    p.add_argument("--paired", action="store_true", help="one version per repeat for every path")
    args = p.parse_args(argv)
    if args.paired and ("generate" not in args.decodes or "fp32" not in args.dtypes):
        p.error("--paired measures every path against fp32 generate: keep both in the lists")
    agent, prompts = demo_prompts(args.model, args.tasks, args.k)
    params = SamplingParams(max_tokens=args.budget, temperature=1.0, ignore_eos=True)
    policy = load_policy(resolve_model(args.model), lora=LoraSettings())
    shape = DecodeShape.from_config(policy.get_base_model().config)
    context = statistics.mean(len(q) for q in prompts) + args.budget / 2
    result: dict = {
        "model": args.model,
        "prompts": len(prompts),
        "budget": args.budget,
        "torch_threads": torch.get_num_threads(),
        "bf16_supported": cpu_has_native("bf16"),
    }
    dtypes = []
    for dtype in args.dtypes:
        if dtype == "bf16" and not cpu_has_native("bf16"):
            result[dtype] = {"skipped": "this CPU has no native bf16"}
        else:
            dtypes.append(dtype)
    with tempfile.TemporaryDirectory() as tmp:
        measured = paired(dtypes, prompts, params, policy, Path(tmp), args) if args.paired else {}
        for dtype in dtypes:
            torch_dtype = torch_dtype_of(dtype)
            rates = measure_rates(torch_dtype, shape, len(prompts))
            itemsize = torch.finfo(torch_dtype).bits // 8
            bound = bounds(shape, len(prompts), context, itemsize, rates)
            row: dict = {"roofline": bound, **measured.get(dtype, {})}
            for decode in args.decodes:
                if not args.paired:
                    row[decode] = measure(decode, dtype, prompts, params, policy, Path(tmp), args)
                row[decode]["generation_roofline_fraction"] = roofline_fraction(
                    row[decode]["tokens_per_s"], bound
                )
            if "generate" in row:  # each other path's tokens/s over generate's
                row["speedup"] = {
                    d: round(row[d]["tokens_per_s"] / row["generate"]["tokens_per_s"], 2)
                    for d in args.decodes
                    if d != "generate"
                }
            result[dtype] = row
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
