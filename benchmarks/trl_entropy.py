"""TRL side of ``benchmarks/entropy_hold.py``: TRL 1.16's ``GRPOTrainer`` with its adaptive
entropy control (``use_adaptive_entropy=True``) on the demo's workload (``bench_trl.run``: the
same model folder, prompts, K, token budget, LoRA, lr, clip and batching as entrogym's runs).

``entropy_target`` is set to the first iteration's logged entropy (:class:`FirstEntropyTarget`;
TRL reads ``args.entropy_target`` at every optimizer step, so setting it after the first
iteration's log takes effect from the second iteration on); ``entropy_coef_delta`` comes from
``--delta``; every other entropy knob stays at TRL's default (``entropy_coef`` 0 as the start,
``entropy_coef_min`` 0, ``entropy_coef_max`` 1, ``top_entropy_quantile`` 1). The LoRA adapter
is saved after the first iteration's update and after the last one, for entrogym's grader.

Runs in ``.venv-bench`` (one fresh process per run); writes one JSON result file: TRL's
per-iteration ``entropy``, ``reward`` and ``entropy_coef`` logs, the target, the adapters'
folders and the timing of ``bench_trl.run``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench_common import Workload

ADAPTER_FIRST, ADAPTER_LAST = "adapter-first", "adapter-last"


class FirstEntropyTarget:
    """Sets ``args.entropy_target`` once, to the first training log's ``entropy``, and keeps
    every training log (one per iteration when ``logging_steps`` is the optimizer steps of an
    iteration)."""

    def __init__(self) -> None:
        self.target: float | None = None
        self.rows: list[dict[str, Any]] = []

    def observe(self, args: Any, logs: dict[str, Any] | None) -> float | None:
        """One ``on_log`` call: a training row (it has ``entropy``) is kept, and the first one
        sets the target. Returns the target (None before the first training row)."""
        if not logs or logs.get("entropy") is None or "train_runtime" in logs:
            return self.target  # the run's summary log, or a log without TRL's metrics
        self.rows.append(dict(logs))
        if self.target is None:
            self.target = float(logs["entropy"])
            args.entropy_target = self.target
        return self.target


def callbacks(tracker: FirstEntropyTarget, out: Path, steps_per_iteration: int) -> list[Any]:
    """TRL callbacks: the target from the first log, and the adapter saved after the first
    iteration's last optimizer step and at the end of training."""
    from transformers import TrainerCallback

    class Hooks(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            tracker.observe(args, logs)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == steps_per_iteration:
                model.save_pretrained(out / ADAPTER_FIRST)

        def on_train_end(self, args, state, control, model=None, **kwargs):
            model.save_pretrained(out / ADAPTER_LAST)

    return [Hooks()]


def run(work: Workload, delta: float, out: Path) -> dict[str, Any]:
    from bench_trl import run as run_trl

    s = work.settings
    steps = s["tasks"] * s["samples"] // s["minibatch_size"]
    tracker = FirstEntropyTarget()
    overrides = {"use_adaptive_entropy": True, "entropy_coef_delta": delta,
                 "logging_steps": steps}  # fmt: skip
    timing = run_trl(work, overrides, callbacks(tracker, out, steps))
    rows = tracker.rows
    import trl
    from trl import GRPOConfig

    fields = GRPOConfig.__dataclass_fields__
    knobs = ("entropy_coef", "entropy_coef_min", "entropy_coef_max", "entropy_target",
             "top_entropy_quantile")  # fmt: skip
    return {
        "trl": {
            "version": trl.__version__,
            "entropy_coef_delta": delta,
            "defaults": {k: fields[k].default for k in knobs},
        },  # fmt: skip
        "entropy": [r["entropy"] for r in rows],
        "reward": [r.get("reward") for r in rows],
        "entropy_coef": [r.get("entropy_coef") for r in rows],
        "entropy_target": tracker.target,
        "adapter_first": str(out / ADAPTER_FIRST),
        "adapter_last": str(out / ADAPTER_LAST),
        "generated_tokens": sum(it["generated_tokens"] for it in timing["iterations"]),
        "startup_s": timing["startup_s"],
        "iteration_s": [it["seconds"] for it in timing["iterations"]],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("workload", type=Path)
    p.add_argument("result", type=Path)
    p.add_argument("--delta", type=float, required=True, help="TRL's entropy_coef_delta")
    p.add_argument("--out", type=Path, required=True, help="folder for the two adapters")
    args = p.parse_args()
    out = run(Workload.load(args.workload), args.delta, args.out)
    args.result.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
