"""Generation alone, for the roofline of ``benchmarks/iteration.py``: this machine's matmul
rate and read bandwidth for one sampler dtype, measured in this process, the bounds they give
at the benchmark's timed batch (``roofline.py``) and, with ``--engine``, the tokens/s of that
engine generating the batch.

The batch: the timed iteration's tasks, each ``samples`` times, every completion run to the
token budget (``ignore_eos``, as in the benchmark's runs), sampled through a non-zero LoRA
adapter of which every repetition gets a new version, as a training iteration does (the
versions are written before the engine starts; loading one is timed). The engine's start-up
and one untimed warm-up call are counted apart; each repetition is timed with the load
average after it.

Run by ``iteration.py`` in a fresh process per engine and dtype; writes one JSON result file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from bench_common import Workload  # noqa: E402
from bench_report import timed_index  # noqa: E402
from roofline import DecodeShape, bounds, measure_rates, timed_generation  # noqa: E402


def timed_prompts(work: Workload) -> list[list[int]]:
    """Token ids of the timed iteration's prompts, each ``samples`` times: what the agent
    sends first (the chat template of [system, user] with the generation prompt)."""
    from entrogym.agents.agent import LLMAgent

    s = work.settings
    first = timed_index(work.iterations) * s["tasks"]
    batch = work.prompts[first : first + s["tasks"]]
    agent = LLMAgent.from_model(
        work.model_dir,
        system_prompt=batch[0][0]["content"],  # the demo's, the same for every task
        max_turn_tokens=s["max_response_tokens"],
        max_context=s["max_context_tokens"],
    )
    ids = []
    for _system, user in batch:
        ids += [agent.start(user["content"]).token_ids] * s["samples"]
    return ids


def roofline_inputs(work: Workload, dtype: str, prompts: list[list[int]]) -> dict:
    """The bounds at the batch's mean context (prompt plus half the budget), with the rates
    measured here."""
    from transformers import AutoConfig

    from entrogym.dtypes import torch_dtype

    shape = DecodeShape.from_config(AutoConfig.from_pretrained(work.model_dir))
    context = statistics.mean(len(p) for p in prompts) + work.settings["max_response_tokens"] / 2
    dt = torch_dtype(dtype)
    return bounds(shape, len(prompts), context, dt.itemsize, measure_rates(dt, shape, len(prompts)))


def adapter_versions(work: Workload, folder: Path, count: int) -> list[str]:
    """``count`` versions of a non-zero LoRA adapter of the benchmark's rank and targets."""
    from decode_throughput import publish

    from entrogym.train.learner.policy import LoraSettings, load_policy

    s = work.settings
    lora = LoraSettings(
        r=s["lora_rank"], alpha=s["lora_alpha"], target_modules=tuple(s["target_modules"])
    )
    policy = load_policy(work.model_dir, lora=lora)
    return [publish(policy, folder / f"v{i}", i + 1) for i in range(count)]


def time_generation(work: Workload, engine: str, dtype: str, prompts, reps: int) -> dict:
    """Start-up, then ``reps`` timed generations of the batch, each with a new adapter."""
    import torch

    from entrogym.agents.engines import SamplingParams, engine_device, make_engine

    if engine_device(engine) != "cpu":
        raise SystemExit(f"the {engine} engine computes on CUDA here; the roofline is the CPU's")
    s = work.settings
    if work.threads is not None:
        torch.set_num_threads(work.threads)
    params = SamplingParams(
        max_tokens=s["max_response_tokens"],
        temperature=s["temperature"],
        ignore_eos=s.get("ignore_eos", True),
    )
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
        adapters = adapter_versions(work, Path(tmp), reps + 1)
        extra = {"threads": work.threads} if engine == "vllm" and work.threads else {}
        t0 = time.perf_counter()
        sampler = make_engine(
            engine,
            work.model_dir,
            dtype=dtype,
            max_model_len=s["max_context_tokens"],
            seed=work.seed,
            max_lora_rank=s["lora_rank"],
            max_num_seqs=len(prompts),
            **extra,
        )
        startup = time.perf_counter() - t0
        runs = []
        with sampler:
            sampler.generate(prompts[:1], SamplingParams(max_tokens=4), adapter=adapters[0])
            for adapter in adapters[1:]:
                runs.append(timed_generation(sampler, prompts, params, adapter))
    return {
        "startup_s": round(startup, 1),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
        "repetitions": runs,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("workload", type=Path)
    p.add_argument("result", type=Path)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--engine", default=None, help="time this engine (default: the rates only)")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    work = Workload.load(args.workload)
    prompts = timed_prompts(work)
    result: dict = {"dtype": args.dtype, "roofline": roofline_inputs(work, args.dtype, prompts)}
    if args.engine:
        result |= {"engine": args.engine} | time_generation(
            work, args.engine, args.dtype, prompts, args.reps
        )
    args.result.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
