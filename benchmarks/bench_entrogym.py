"""entrogym side of ``benchmarks/iteration.py``: the demo's GRPO iteration through the real
``Trainer``, with each phase timed by wrapping the trainer's own pieces (no trainer change).

Run by ``iteration.py`` in a fresh process per repetition; writes one JSON result file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402
from bench_common import ModelShape, Workload, matmul_ceiling  # noqa: E402


@contextlib.contextmanager
def _timed(phases: dict[str, float], name: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        phases[name] += time.perf_counter() - t0


def _trainer(work: Workload, engine: str, scoring: str, out: Path):
    """The demo's GRPO Trainer, with the benchmark's dtype and (for bf16) an fp32 LM head."""
    import functools

    import entrogym.train.trainer as trainer_mod
    from entrogym.demo import demo_config

    s = work.settings
    cfg = demo_config("grpo", out, work.iterations, s["lr"], eval_tasks=0)
    cfg.model, cfg.engine, cfg.dtype = work.model_dir, engine, work.dtype
    cfg.eval_env, cfg.eval_every, cfg.checkpoint_every = None, 0, 10**9
    cfg.seed = work.seed
    cfg.tasks_per_iter, cfg.samples = s["tasks"], s["samples"]
    cfg.early_stop_min_per_task, cfg.micro_batch_size = s["samples"], s["micro_batch_size"]
    cfg.algo_overrides = {"epochs": 1, "minibatch_size": s["minibatch_size"]}
    if work.dtype != "fp32" or work.device != "cpu":
        # The trainer has no head_dtype / device option yet (the lead wires them in).
        head = "fp32" if work.dtype != "fp32" else None
        trainer_mod.load_policy = functools.partial(
            trainer_mod.load_policy, head_dtype=head, device=work.device
        )
    return trainer_mod.Trainer(cfg)


def _timed_score(trainer, phases: dict[str, float], counts: dict, scoring: str, device: str):
    """Trainer.score as it is, plus FLOP/token counting, the device move and (with
    ``scoring="fast"``) the action-only head and trimmed micro-batches."""
    from entrogym.train.logprobs import sequence_logprobs, sequence_logprobs_and_entropy

    shape = ModelShape.of(trainer.policy)

    def score(batch, index, need_entropy):
        rows = batch.select(index)
        fn = sequence_logprobs_and_entropy if need_entropy else sequence_logprobs
        phase = "training_forward" if torch.is_grad_enabled() else "old_logprobs"
        opts = dict(trainer.logprob_opts)
        lps, ents = [], []
        with _timed(phases, phase):
            for s in range(0, len(rows), trainer.cfg.micro_batch_size):
                sl = slice(s, s + trainer.cfg.micro_batch_size)
                ids, mask, act = (
                    x[sl].to(device)
                    for x in (rows.input_ids, rows.attention_mask, rows.action_mask)
                )
                if scoring == "fast":
                    opts.update(score_mask=act, layout="trimmed")
                out = fn(trainer.policy, ids, mask, **opts)
                lp, ent = out if need_entropy else (out, None)
                lps.append(lp.cpu())
                ents.append(ent.cpu() if need_entropy else None)
                lengths = mask.sum(1).tolist()
                heads = int(act[:, 1:].sum()) if scoring == "fast" else sum(n - 1 for n in lengths)
                counts["learner_flops"] += shape.forward_flops(lengths, heads)
                counts["learner_tokens"] += sum(lengths)
                if phase == "training_forward":  # each is followed by one backward
                    counts["backward_flops"] += shape.backward_flops(lengths, heads)
        t = batch.input_ids.shape[1]
        pad = lambda x: torch.nn.functional.pad(x, (0, t - x.shape[1]))  # noqa: E731
        return pad(torch.cat(lps)), pad(torch.cat(ents)) if need_entropy else None

    return score


def instrument(trainer, phases: dict[str, float], counts: dict, scoring: str, device: str):
    """Wrap collect / score / backward / step / publish_adapter / grading with timers."""
    import entrogym.envs.grading as grading

    grade = grading.grade

    def timed_grade(*args, **kwargs):
        with _timed(phases, "grading"):
            return grade(*args, **kwargs)

    grading.grade = timed_grade
    collect = trainer.collect

    def timed_collect(it):
        with _timed(phases, "collect"):
            result = collect(it)
        if not isinstance(result, str):
            counts["generated_tokens"] += int(result[0].action_mask.sum())
        return result

    score = _timed_score(trainer, phases, counts, scoring, device)

    class TimedScaler:
        def __init__(self, inner):
            self.inner = inner

        def scale(self, loss):
            scaled = self.inner.scale(loss)

            class _Backward:
                @staticmethod
                def backward():
                    with _timed(phases, "backward"):
                        scaled.backward()

            return _Backward

        def __getattr__(self, name):
            return getattr(self.inner, name)

    step, publish = trainer.step, trainer.publish_adapter

    def timed_step():
        with _timed(phases, "optimizer"):
            return step()

    def timed_publish(version):
        with _timed(phases, "adapter_handover"):
            return publish(version)

    trainer.collect, trainer.score, trainer.step = timed_collect, score, timed_step
    trainer.publish_adapter = timed_publish
    trainer.scaler = TimedScaler(trainer.scaler)


def run(work: Workload, engine: str, scoring: str) -> dict:
    t_spawn = float(os.environ.get("BENCH_SPAWN_TIME", time.time()))
    if work.threads:
        from entrogym.train.precision import apply_threads

        apply_threads(work.threads)
    torch.manual_seed(work.seed)
    with tempfile.TemporaryDirectory(prefix="entrogym-bench-") as tmp:
        trainer = _trainer(work, engine, scoring, Path(tmp))
        iterations = []
        phases: dict[str, float] = defaultdict(float)
        counts: dict = defaultdict(float)
        trainer.publish_adapter(0)  # as Trainer.fit does: the first rollouts' adapter
        startup_s = time.time() - t_spawn
        instrument(trainer, phases, counts, scoring, work.device)
        try:
            for it in range(work.iterations):
                phases.clear()
                counts.clear()
                t0 = time.perf_counter()
                row = trainer.iteration(it)
                trainer.publish_adapter(it + 1)
                total = time.perf_counter() - t0
                iterations.append(_summary(dict(phases), dict(counts), total, row))
        finally:
            trainer.close()
    return {"startup_s": startup_s, "iterations": iterations, **_ceilings(work)}


def _summary(phases: dict, counts: dict, total: float, row: dict) -> dict:
    phases["generation"] = phases.pop("collect", 0.0) - phases.get("grading", 0.0)
    phases["other"] = total - sum(phases.values())
    learner_s = phases.get("old_logprobs", 0) + phases.get("training_forward", 0)
    learner_s += phases.get("backward", 0)
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
    p.add_argument("--scoring", choices=("exact", "fast"), default="exact")
    args = p.parse_args()
    result = run(Workload.load(args.workload), args.engine, args.scoring)
    args.result.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
