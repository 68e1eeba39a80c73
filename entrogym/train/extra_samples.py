"""Samples drawn outside an iteration's rollouts, for the entropy control alone: the target
probe's batches of the initial policy (``algo.controller.target_probe``) and the ``aepo``
lever's samples at another temperature. Neither is trained on as experience; each is sampled
on rank 0, broadcast to a torchrun learner, and scored in fp32 like an iteration's batch."""

from __future__ import annotations

import time
from typing import Any

from entrogym.algos import EntropyControl
from entrogym.algos.aepo import Aepo
from entrogym.train.devices import distributed
from entrogym.train.devices.distributed import Ranks
from entrogym.train.learner.update import Learner
from entrogym.train.phases import PhaseClock
from entrogym.train.sampler.engine import Sampler


def probe_target(
    control: EntropyControl, sampler: Sampler, learner: Learner, ranks: Ranks, start: int
) -> str | None:
    """Feed the controller's target ``control.probe_batches`` batches sampled from the initial
    policy before the first update (``Sampler.probe_batches``), their entropies in the
    estimator the controller tracks. Returns the line to print, or None without a probe."""
    n = control.probe_batches
    if not n:
        return None
    t0 = time.perf_counter()
    batches = distributed.on_main(lambda: sampler.probe_batches(n, start), ranks)
    entropies = [learner.probe_entropy(batch, control) for batch in batches]
    control.observe_probe(entropies)
    listed = ", ".join(f"{h:.3f}" for h in entropies)
    return (f"target probe: {n} batches of the initial policy, entropy {listed} nats "
            f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip


def attach_temperature_samples(
    it: int, control: EntropyControl, sampler: Sampler, learner: Learner, ranks: Ranks,
    phases: PhaseClock,
) -> dict[str, Any]:  # fmt: skip
    """The ``aepo`` lever's extra samples (``entrogym.algos.aepo``): drawn by the current
    weights at the temperature T the controller holds now, for ``share`` of the iteration's
    tasks, and attached to the lever with the learner's fp32 scoring. Their metrics (T, how
    many, their mean reward); empty for other levers."""
    lever = control.lever
    if not isinstance(lever, Aepo):
        return {}
    temperature = float(control.coefficient)
    share = lever.params.share
    batch, stats = distributed.on_main(
        lambda: sampler.collect_at_temperature(it, temperature, share), ranks
    )
    phases.add("generation", stats["generate_s"])
    phases.add("env", stats["env_s"])
    lever.attach(learner.temperature_samples(batch))
    return {
        "aepo_temperature": temperature,
        "aepo_samples": len(batch),
        "aepo_reward": float(batch.rewards.mean()),
    }
