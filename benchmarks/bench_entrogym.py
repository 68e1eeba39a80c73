"""entrogym side of ``benchmarks/iteration.py``: the demo's GRPO iteration through the real
``Trainer``, configured through ``TrainConfig`` and timed by thin wrappers around the trainer's
own pieces (``score``, the backward, ``step``, ``publish_adapter``, ``collect``, ``grade``).
Nothing of the trainer's math is re-implemented or patched.

Run by ``iteration.py`` in a fresh process per repetition; writes one JSON result file.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402
from bench_common import ModelShape, Workload, matmul_ceiling  # noqa: E402

# --scoring: the TrainConfig options it stands for (fast is the trainer's default).
SCORING = {
    "fast": {"score_layout": "trimmed", "action_only_head": True},
    "exact": {"score_layout": "padded", "action_only_head": False},
}


@contextlib.contextmanager
def _timed(phases: dict[str, float], name: str, device: str = "cpu") -> Iterator[None]:
    """Adds the block's wall time to ``phases[name]`` (CUDA work is waited for first)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        sync()
        phases[name] += time.perf_counter() - t0


def train_config(work: Workload, engine: str, scoring: str, out: Path) -> Any:
    """The demo's GRPO TrainConfig with the workload's shapes and the benchmark's options."""
    from entrogym.demo import demo_config

    s = work.settings
    cfg = demo_config("grpo", out, work.iterations, s["lr"], eval_tasks=0)
    # replace() re-runs TrainConfig's validation on the new values
    return dataclasses.replace(
        cfg,
        model=work.model_dir,
        engine=engine,
        dtype=work.dtype,
        threads=work.threads,
        seed=work.seed,
        tasks_per_iter=s["tasks"],
        samples=s["samples"],
        early_stop_min_per_task=s["samples"],
        micro_batch_size=s["micro_batch_size"],
        algo={"name": "grpo", "epochs": 1, "minibatch_size": s["minibatch_size"]},
        eval_env=None,
        eval_every=0,
        checkpoint_every=10**9,
        **SCORING[scoring],
    )


def _on_device(batch: Any, device: str, cache: dict) -> Any:
    """``batch`` with its tensors on ``device`` (moved once per batch). TrainConfig has no
    device option; for ``--device cuda`` the policy is moved after construction and the rows
    follow it here, so the trainer's own ``score`` runs unchanged on the GPU."""
    if device == "cpu":
        return batch
    if cache.get("key") is not batch:
        moved = {
            f.name: getattr(batch, f.name).to(device)
            if isinstance(getattr(batch, f.name), torch.Tensor)
            else getattr(batch, f.name)
            for f in dataclasses.fields(batch)
        }
        cache.update(key=batch, value=type(batch)(**moved))
    return cache["value"]


def timed_score(trainer: Any, phases: dict, counts: dict, device: str) -> Callable:
    """``Trainer.score`` as it is, timed (no grad: old log-probs; grad: training forward) and
    with the useful FLOPs of the rows it scored counted (padding the layout computes does not
    count). The outputs come back to the CPU, where the update's other tensors live."""
    score, shape, moved = trainer.score, ModelShape.of(trainer.policy), {}

    def wrapped(batch: Any, index: torch.Tensor, need_entropy: bool) -> tuple:
        phase = "training_forward" if torch.is_grad_enabled() else "old_logprobs"
        with _timed(phases, phase, device):
            lp, ent = score(_on_device(batch, device, moved), index, need_entropy)
            lp, ent = lp.cpu(), ent.cpu() if ent is not None else None
        _, mask = batch.tokens(index)
        lengths = [int(n) for n in mask.sum(1)]
        if trainer.cfg.action_only_head:
            heads = int(batch.actions(index)[:, 1:].sum())
        else:
            heads = sum(n - 1 for n in lengths)
        counts["learner_flops"] += shape.forward_flops(lengths, heads)
        counts["learner_tokens"] += sum(lengths)
        if phase == "training_forward":  # each is followed by one backward
            counts["backward_flops"] += shape.backward_flops(lengths, heads)
        return lp, ent

    return wrapped


class TimedScaler:
    """The trainer's loss scaler, with ``scale(loss).backward()`` timed as the backward."""

    def __init__(self, inner: Any, phases: dict, device: str) -> None:
        self.inner, self.phases, self.device = inner, phases, device

    def scale(self, loss: torch.Tensor) -> Any:
        scaled, phases, device = self.inner.scale(loss), self.phases, self.device

        class _Backward:
            @staticmethod
            def backward() -> None:
                with _timed(phases, "backward", device):
                    scaled.backward()

        return _Backward

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _timing(fn: Callable, phases: dict, name: str, device: str = "cpu") -> Callable:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with _timed(phases, name, device):
            return fn(*args, **kwargs)

    return wrapped


def instrument(trainer: Any, phases: dict, counts: dict, device: str) -> None:
    """Time collect / grading / score / backward / step / publish_adapter."""
    import entrogym.envs.grading as grading

    grading.grade = _timing(grading.grade, phases, "grading")  # the env imports it per call
    collect = _timing(trainer.collect, phases, "collect")

    def counted_collect(it: int) -> Any:
        batch, stats = collect(it)
        counts["generated_tokens"] += int(batch.action_mask.sum())
        return batch, stats

    trainer.collect = counted_collect
    trainer.score = timed_score(trainer, phases, counts, device)
    trainer.step = _timing(trainer.step, phases, "optimizer", device)
    trainer.publish_adapter = _timing(trainer.publish_adapter, phases, "adapter_handover")
    trainer.scaler = TimedScaler(trainer.scaler, phases, device)


def run(work: Workload, engine: str, scoring: str) -> dict:
    from entrogym.train.trainer import Trainer

    t_spawn = float(os.environ.get("BENCH_SPAWN_TIME", time.time()))
    torch.manual_seed(work.seed)
    with tempfile.TemporaryDirectory(prefix="entrogym-bench-") as tmp:
        trainer = Trainer(train_config(work, engine, scoring, Path(tmp)))
        if work.device != "cpu":  # in place: the optimizer keeps the same parameters
            trainer.policy.to(work.device)
        iterations = []
        phases: dict[str, float] = defaultdict(float)
        counts: dict = defaultdict(float)
        trainer.publish_adapter(0)  # as Trainer.fit does: the first rollouts' adapter
        startup_s = time.time() - t_spawn
        instrument(trainer, phases, counts, work.device)
        try:
            for it in range(work.iterations):
                phases.clear()
                counts.clear()
                t0 = time.perf_counter()
                row = trainer.iteration(it)
                trainer.publish_adapter(it + 1)
                total = time.perf_counter() - t0
                iterations.append(summary(dict(phases), dict(counts), total, row))
        finally:
            trainer.close()
    return {"startup_s": startup_s, "iterations": iterations, **_ceilings(work)}


def summary(phases: dict, counts: dict, total: float, row: dict) -> dict:
    """One iteration's phases (generation = collect - grading; other = the rest), rates and
    the trainer's own exactness metrics."""
    phases["generation"] = phases.pop("collect", 0.0) - phases.get("grading", 0.0)
    phases["other"] = total - sum(phases.values())
    learner_s = sum(phases.get(k, 0.0) for k in ("old_logprobs", "training_forward", "backward"))
    flops = counts.get("learner_flops", 0) + counts.get("backward_flops", 0)
    return {
        "seconds": total,
        "phases_s": {k: round(v, 3) for k, v in phases.items()},
        "generated_tokens": int(counts.get("generated_tokens", 0)),
        "generated_tokens_per_s": counts.get("generated_tokens", 0)
        / max(phases["generation"], 1e-9),
        "learner_tokens_per_s": counts.get("learner_tokens", 0) / max(learner_s, 1e-9),
        "learner_gflops_per_s": flops / max(learner_s, 1e-9) / 1e9,
        "sampler_mismatch": row.get("sampler_mismatch"),
        "clip_frac_low": row.get("clip_frac_low"),
        "clip_frac_high": row.get("clip_frac_high"),
    }


def _ceilings(work: Workload) -> dict:
    """The matmul ceilings, measured in this process with its thread count."""
    return {
        "threads": torch.get_num_threads(),
        "ceiling_gflops": {
            "fp32": matmul_ceiling(torch.float32, work.device),
            "bf16": matmul_ceiling(torch.bfloat16, work.device),
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("workload", type=Path)
    p.add_argument("result", type=Path)
    p.add_argument("--engine", default="hf")
    p.add_argument("--scoring", choices=tuple(SCORING), default="fast")
    args = p.parse_args()
    result = run(Workload.load(args.workload), args.engine, args.scoring)
    args.result.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
