"""How much a batch's entropy estimate spreads for one fixed policy: sampled surprisal, exact, and
relative to the base model.

The demo's workload (``demo_workload.py``: SmolLM2-135M-Instruct, the ``hf`` engine in fp32,
one-digit ``entrogym/Arithmetic-v0``, TASKS x SAMPLES = 4 x 4 trajectories a batch, 48 response
tokens) with the policy held fixed: at the base model (the LoRA adapter at its init, which
leaves the base model's outputs unchanged) or at a trained adapter (``--adapter``). The
trainer that ``entrogym demo`` would build collects N batches, as its first N iterations would
draw their tasks and seeds, and scores each in fp32 (``Learner.score``), with the exact
per-token entropies. Per batch, three estimates of the policy's mean token entropy over the
batch's action tokens:

* ``sampled``: mean of -log p(sampled token) (``entrogym.algos.sampled_entropy``), what the
  controllers tracked with ``algo.controller.estimator: sampled``;
* ``exact``: mean of -sum_v p(v) log p(v) at the same positions
  (``entrogym.algos.exact_batch_entropy``), ``estimator: exact``;
* ``relative``: the exact mean over the base model's exact mean at the same positions
  (``entrogym.algos.relative_entropy``), ``estimator: relative`` (1.0 for the base model itself,
  so it says something only with ``--adapter``).

Prints one JSON document: per estimator the batch values, their mean, std (n - 1) and relative
spread std / mean; the per-batch difference sampled - exact (``paired_difference``); the load
average before and after; the wall time.

    PYTHONPATH=$PWD nice -n 0 .venv/bin/python benchmarks/entropy_estimators.py --batches 12 \
        [--adapter runs/X/stage1/seed0/grpo/adapters/v000030]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def estimator_summary(values: list[float]) -> dict[str, Any]:
    """The batch values, their mean, sample std and relative spread (std / mean)."""
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"values": values, "mean": mean, "std": std, "relative_spread": std / mean}


def paired_difference(sampled: list[float], exact: list[float]) -> dict[str, float]:
    """The per-batch difference sampled - exact: its mean (0 in expectation: both estimate
    the same entropy) and std, and var(difference) / var(sampled), the share of the sampled
    estimate's variance that drawing one token per position adds (the rest is the spread of
    the states themselves, which the exact estimate keeps)."""
    diff = [s - e for s, e in zip(sampled, exact, strict=True)]
    return {
        "mean": statistics.fmean(diff),
        "std": statistics.stdev(diff),
        "variance_share_of_sampled": statistics.variance(diff) / statistics.variance(sampled),
    }


def batch_estimates(trainer: Any, batch: Any) -> dict[str, float]:
    """One batch scored in fp32 under the trainer's policy: both estimates of its entropy."""
    from entrogym.algos import exact_batch_entropy, sampled_entropy

    logprobs = torch.zeros(batch.mask.shape)
    entropies = torch.zeros(batch.mask.shape)
    rows = torch.arange(len(batch))
    with torch.no_grad():
        for index in batch.micro_batches(rows, trainer.cfg.micro_batch_size, None):
            lp, ent = trainer.learner.score(batch, index, need_entropy=True)
            logprobs[index, : lp.shape[1]] = lp
            entropies[index, : ent.shape[1]] = ent
    return {
        "sampled": sampled_entropy(logprobs, batch.mask),
        "exact": exact_batch_entropy(entropies, batch.mask),
        "relative": trainer.learner.relative_entropy(batch)[0],
        "action_tokens": int(batch.mask.sum()),
    }


def measure(
    batches: int, threads: int | None, seed: int, adapter: str | None = None,
    model: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    from demo_workload import DEFAULT_LR, demo_config

    from entrogym.commands.demo_runs import parse_run
    from entrogym.train.trainer import Trainer

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="entrogym-estimators-") as tmp:
        cfg = demo_config(
            parse_run("grpo").algo, Path(tmp), batches, DEFAULT_LR, 0, seed=seed,
            threads=threads, init_adapter=adapter, model=model,
        )  # fmt: skip
        trainer = Trainer(cfg)
        try:
            # the policy held fixed: the base model or ``adapter``
            trainer.sampler.publish_adapter(0)
            rows = []
            for it in range(batches):
                batch, _ = trainer.sampler.collect(it, version=0)
                rows.append(batch_estimates(trainer, batch))
                print(f"batch {it}: {rows[-1]}", file=sys.stderr, flush=True)
        finally:
            trainer.close(barrier=False)
    return {
        "model": cfg.model,
        "adapter": adapter,
        "batches": batches,
        "trajectories_per_batch": cfg.tasks_per_iter * cfg.samples,
        "action_tokens": [r["action_tokens"] for r in rows],
        "estimators": {
            name: estimator_summary([r[name] for r in rows])
            for name in ("sampled", "exact", "relative")
        },
        "sampled_minus_exact": paired_difference(
            [r["sampled"] for r in rows], [r["exact"] for r in rows]
        ),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "wall_s": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=12, help="batches to sample (>= 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (all cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--adapter", default=None, help="a saved adapter to hold (default: none)")
    parser.add_argument("--model", default=None, help="the base model (default: the demo's)")
    args = parser.parse_args(argv)
    if args.batches < 2:
        parser.error(f"--batches must be >= 2 to measure a spread, got {args.batches}")
    if args.adapter is not None and not Path(args.adapter).is_dir():
        parser.error(f"--adapter {args.adapter}: no such folder; give a saved adapter's folder")
    report = measure(args.batches, args.threads, args.seed, args.adapter, args.model)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
