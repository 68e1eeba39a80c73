"""entrogym side of ``benchmarks/iteration.py``: the demo's GRPO iterations, run by the real
``Trainer.fit`` configured through ``TrainConfig``. The timings are the trainer's own (every
metrics row's ``phases_s``); a phase hook counts the learner's FLOPs. Nothing of the trainer
is re-implemented, wrapped or patched.

Run by ``iteration.py`` in a fresh process per repetition; writes one JSON result file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402
from bench_common import ModelShape, Workload, matmul_ceiling  # noqa: E402

from entrogym.dtypes import cpu_has_native  # noqa: E402
from entrogym.train.config import OLD_LOGPROBS, THREAD_SPLITS  # noqa: E402

# --scoring: the TrainConfig options it stands for (fast is the trainer's default).
SCORING = {
    "fast": {"score_layout": "trimmed", "action_only_head": True},
    "exact": {"score_layout": "padded", "action_only_head": False},
}


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """The benchmark's options for entrogym's side (its command line, as data); each maps onto
    the TrainConfig option of the same name, except ``scoring`` (:data:`SCORING`)."""

    engine: str = "hf"
    scoring: str = "fast"
    env_workers: int | None = None  # None: the trainer's
    max_staleness: int = 0
    trim_heap: bool = True
    thread_split: str = "elastic"
    old_logprobs: str = "learner"


def train_config(work: Workload, opts: BenchOptions, out: Path) -> Any:
    """The demo's GRPO TrainConfig with the workload's shapes and the benchmark's options."""
    from demo_workload import demo_config

    from entrogym.algos import get_algorithm

    s = work.settings
    # the engine goes through demo_config, which keeps the decode path the hf engine's only
    cfg = demo_config(get_algorithm("grpo"), out, work.iterations, s["lr"], eval_tasks=0,
                      engine=opts.engine, **multiturn_task(work))  # fmt: skip
    # replace() re-runs TrainConfig's validation on the new values
    return dataclasses.replace(
        cfg,
        model=work.model_dir,
        dtype=work.dtype,
        threads=work.threads,
        seed=work.seed,
        tasks_per_iter=s["tasks"],
        samples=s["samples"],
        early_stop_min_per_task=s["samples"],
        micro_batch_size=s["micro_batch_size"],
        algo=dataclasses.replace(
            get_algorithm("grpo"), epochs=1, minibatch_size=s["minibatch_size"]
        ),
        eval_env=None,
        eval_every=0,
        checkpoint_every=10**9,
        env_workers=cfg.env_workers if opts.env_workers is None else opts.env_workers,
        max_staleness=opts.max_staleness,
        trim_heap=opts.trim_heap,
        thread_split=opts.thread_split,
        old_logprobs=opts.old_logprobs,
        **SCORING[opts.scoring],
    )


def multiturn_task(work: Workload) -> dict[str, Any]:
    """demo_config's task for the multi-turn workload (none for the demo's): TalkTools (one tool,
    every turn a call but the last; multiturn_env.py) on the workload's rows, the tools shown by
    the chat template, and a turn that reaches its token budget still a turn (``step``)."""
    if work.multiturn is None:
        return {}
    s = work.settings
    rows = [{"prompt": p} for p in work.prompts]
    return {
        "env": "multiturn_env:TalkTools-v0",
        "env_kwargs": {"dataset": rows, "max_turns": work.multiturn["turns"]},
        "settings": {"tool_format": "template", "on_turn_budget": "step",
                     "max_response_tokens": s["max_response_tokens"],
                     "max_context_tokens": s["max_context_tokens"]},
    }  # fmt: skip


class LearnerCounts:
    """A phase hook (``entrogym.train.phases``): the useful FLOPs and tokens of the rows each of
    the trainer's scoring passes worked on (padding a layout computes does not count), per
    iteration; the trainer's ``publish`` phase ends an iteration."""

    def __init__(self, trainer: Any) -> None:
        self.shape = ModelShape.of(trainer.learner.policy)
        self.action_only = trainer.cfg.action_only_head
        self.current: dict[str, float] = defaultdict(float)
        self.iterations: list[dict[str, float]] = []

    def __call__(self, phase: str, seconds: float, info: dict) -> None:
        if phase == "publish":
            self.iterations.append(dict(self.current))
            self.current.clear()
            return
        if phase not in ("scoring", "forward"):
            return
        batch, index = info["batch"], info["index"]
        _, mask = batch.tokens(index)
        lengths = [int(n) for n in mask.sum(1)]
        if self.action_only:
            heads = int(batch.actions(index)[:, 1:].sum())
        else:
            heads = sum(n - 1 for n in lengths)
        self.current["learner_flops"] += self.shape.forward_flops(lengths, heads)
        if phase == "forward":  # each is followed by one backward
            self.current["learner_flops"] += self.shape.backward_flops(lengths, heads)


def run(work: Workload, opts: BenchOptions) -> dict:
    from entrogym.train.folder.metrics import read_metrics
    from entrogym.train.trainer import Trainer

    t_spawn = float(os.environ.get("BENCH_SPAWN_TIME", time.time()))
    torch.manual_seed(work.seed)
    if work.multiturn is not None:
        from multiturn_env import set_tool_latency

        set_tool_latency(work.multiturn["latency_ms"])
    with tempfile.TemporaryDirectory(prefix="entrogym-bench-") as tmp:
        cfg = train_config(work, opts, Path(tmp))
        sampler_engine = device_engine(cfg, work.device)
        trainer = Trainer(cfg, engine=sampler_engine)
        # equal work: every turn runs to the token budget (a sampler setting, no training option)
        trainer.sampler.ignore_eos = work.settings.get("ignore_eos", False)
        counts = LearnerCounts(trainer)
        trainer.phases.hooks.append(counts)
        if work.device != "cpu":  # in place: the optimizer keeps the same parameters
            trainer.learner.policy.to(work.device)
        startup_s = time.time() - t_spawn
        try:
            trainer.fit()
        finally:
            trainer.close()
            if sampler_engine is not None:  # the trainer closes only the engines it started
                sampler_engine.close()
        rows = [r for r in read_metrics(trainer.run.dir) if r.get("kind", "train") == "train"]
    iterations = [summary(row, c) for row, c in zip(rows, counts.iterations, strict=True)]
    sampler = {
        "engine": trainer.cfg.engine,
        "engine_dtype": trainer.cfg.engine_dtype,
        "engine_device": work.device if sampler_engine is not None else "cpu",
    }
    return {"startup_s": startup_s, "iterations": iterations, **sampler, **_ceilings(work)}


def device_engine(cfg: Any, device: str) -> Any:
    """With ``--device cuda`` the ``hf`` sampler computes on the learner's GPU, as TRL's
    generation does, so the comparison is GPU against GPU (the trainer's own ``hf`` engine
    computes on the CPU). None on the CPU and for the vLLM engines, which place themselves."""
    from entrogym.agents.engines import make_engine, resolve_engine_kind

    if device == "cpu" or resolve_engine_kind(cfg.engine) != "hf":
        return None
    from entrogym.train.sampler.adapters import StalenessBudget

    versions = StalenessBudget(cfg.max_staleness).versions  # what the trainer's engine holds
    kwargs = cfg.engine_kwargs(seed=cfg.seed, lora_rank=cfg.lora_rank, max_loras=versions)
    return make_engine("hf", cfg.model, device=device, **kwargs)


def summary(row: dict, counts: dict) -> dict:
    """One iteration's phases (the trainer's ``phases_s``; other = the rest of the iteration),
    token counts, rates and the trainer's own exactness metrics. When rollouts ran beside the
    update (``--max-staleness``), generation and env time were spent in the rollout thread,
    not on the iteration's clock: ``wait`` is what the update waited for its batch, and
    ``other`` is the rest beside the learner's own phases."""
    total = row["iteration_s"]
    phases = dict(row["phases_s"])
    beside = row.get("staleness_max", 0) > 0
    on_clock = [k for k in phases if not (beside and k in ("generation", "env"))]
    if beside:
        phases["wait"] = row["rollout_wait_s"]
        on_clock.append("wait")
    phases["other"] = max(total - sum(phases[k] for k in on_clock), 0.0)
    learner_s = sum(phases[k] for k in ("scoring", "forward", "backward"))
    return {
        "seconds": total,
        "beside": beside,
        "phases_s": {k: round(v, 3) for k, v in phases.items()},
        "generated_tokens": row["generated_tokens"],
        "learner_tokens": row["learner_tokens"],
        "generated_tokens_per_s": row["generated_tokens"] / max(phases["generation"], 1e-9),
        "learner_tokens_per_s": row["learner_tokens"] / max(learner_s, 1e-9),
        "learner_gflops_per_s": counts.get("learner_flops", 0) / max(learner_s, 1e-9) / 1e9,
        "sampler_mismatch": row.get("sampler_mismatch"),
        "clip_frac_low": row.get("clip_frac_low"),
        "clip_frac_high": row.get("clip_frac_high"),
        "learner_all_cores_s": row.get("learner_all_cores_s"),  # --thread-split elastic only
    }


def _ceilings(work: Workload) -> dict:
    """The matmul ceilings, measured in this process with its thread count. Where the CPU has
    no native bf16, torch's reference bf16 GEMM runs at ~0.2 GFLOP/s, size for size: the
    default 2048-wide measurement would take ~10 minutes for the same rate that a 256-wide
    one gives in ~2 s."""
    emulated = work.device == "cpu" and not cpu_has_native("bf16")
    bf16 = {"n": 256, "reps": 2} if emulated else {}
    return {
        "threads": torch.get_num_threads(),
        "ceiling_gflops": {
            "fp32": matmul_ceiling(torch.float32, work.device),
            "bf16": matmul_ceiling(torch.bfloat16, work.device, **bf16),
        },
    }


def parse_args(argv: list[str] | None = None) -> tuple[Path, Path, BenchOptions]:
    """The worker's command line: its workload file, its result file and its options (each
    option's default is :class:`BenchOptions`')."""
    default = BenchOptions()
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("workload", type=Path)
    p.add_argument("result", type=Path)
    p.add_argument("--engine", default=default.engine)
    p.add_argument("--scoring", choices=tuple(SCORING), default=default.scoring)
    p.add_argument("--env-workers", type=int, default=default.env_workers,
                   help="default: the trainer's")  # fmt: skip
    p.add_argument("--max-staleness", type=int, default=default.max_staleness)
    p.add_argument("--no-trim-heap", dest="trim_heap", action="store_false")
    p.add_argument("--thread-split", choices=THREAD_SPLITS, default=default.thread_split)
    p.add_argument("--old-logprobs", choices=OLD_LOGPROBS, default=default.old_logprobs)
    args = p.parse_args(argv)
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(BenchOptions)}
    return args.workload, args.result, BenchOptions(**fields)


def main() -> None:
    workload, result_file, opts = parse_args()
    result_file.write_text(json.dumps(run(Workload.load(workload), opts)))


if __name__ == "__main__":
    main()
