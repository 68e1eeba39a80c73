"""Samples drawn outside an iteration's rollouts, for the entropy control alone: the target
probe's batches of the initial policy (``algo.controller.target_probe``; with ``estimator
probe`` also the fixed states rescored every iteration) and the ``aepo`` lever's samples at
another temperature. Neither is trained on as experience; each is sampled on rank 0,
broadcast to a torchrun learner, and scored in fp32 like an iteration's batch."""

from __future__ import annotations

import time
from typing import Any

import torch

from entrogym.algos import AlgorithmConfig, EntropyControl, UpdateBatch
from entrogym.algos.aepo import Aepo
from entrogym.algos.algorithm import target_params
from entrogym.train.devices import distributed
from entrogym.train.devices.distributed import Ranks
from entrogym.train.learner.update import Learner
from entrogym.train.phases import PhaseClock
from entrogym.train.sampler.engine import Sampler


def probe_request(algo: AlgorithmConfig, start: int) -> int:
    """How many batches the sampler draws from the initial policy before the first update, for
    a ratio target (``algo.controller.target_probe``, validated where it is parsed: a
    controller without a target, or with one in nats, has none). None on a resumed run
    (``start`` > 0): its checkpoint holds what the probe measured."""
    params = target_params(algo)
    return params.target_probe if params is not None and start == 0 else 0


def probe_target(
    algo: AlgorithmConfig, control: EntropyControl, sampler: Sampler, learner: Learner,
    ranks: Ranks, start: int,
) -> tuple[str | None, list[UpdateBatch]]:  # fmt: skip
    """Feed the controller's target ``probe_request`` batches sampled from the initial policy
    (``Sampler.probe_batches``), their entropies in the estimator the controller tracks.
    Returns the line to print (None without a probe) and the batches, which ``estimator
    probe`` keeps as its fixed states."""
    n = probe_request(algo, start)
    if not n:
        return None, []
    t0 = time.perf_counter()
    batches = distributed.on_main(lambda: sampler.probe_batches(n, start), ranks)
    entropies = [learner.probe_entropy(batch, control) for batch in batches]
    control.observe_probe(entropies)
    listed = ", ".join(f"{h:.3f}" for h in entropies)
    line = (f"target probe: {n} batches of the initial policy, entropy {listed} nats "
            f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    return line, batches


def observe_probe_states(
    control: EntropyControl, learner: Learner, saved: list[dict[str, Any]]
) -> None:
    """``estimator probe``: hand the controller the policy being trained's entropy on the
    probe batches' states (``saved``, as ``states_to_dict`` keeps them in the run's state: the
    mean of their exact entropies, each batch weighing one, as the probe measured them),
    before the iteration's update. Nothing for another estimator."""
    if control.tracks_probe_states:
        entropies = [learner.probe_entropy(batch, control) for batch in states_from_dict(saved)]
        control.observe_states(sum(entropies) / len(entropies))


_STATE_FIELDS = ("input_ids", "attention_mask", "mask", "lengths")


def states_to_dict(states: list[UpdateBatch]) -> list[dict[str, Any]]:
    """The probe states a checkpoint keeps (JSON-able token ids and masks), so that a resumed
    run tracks the same states."""
    return [{name: getattr(b, name).tolist() for name in _STATE_FIELDS} for b in states]


def states_from_dict(saved: list[dict[str, Any]]) -> list[UpdateBatch]:
    """``states_to_dict``'s batches again: what scoring reads (no rewards, no advantages)."""
    batches = []
    for rows in saved:
        tensors = {name: torch.tensor(rows[name]) for name in _STATE_FIELDS}
        zeros = torch.zeros(len(tensors["lengths"]))
        batches.append(UpdateBatch(rewards=zeros, group_ids=zeros.long(), **tensors))
    return batches


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
