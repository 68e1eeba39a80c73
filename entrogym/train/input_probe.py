"""Input dependence beside entropy: how much the policy's responses depend on the task, the mutual
information I(X; Y) of fixed probe tasks and the responses the current weights sample for them
(``entrogym.algos.input_dependence``), measured every ``input_dependence_every`` iterations and,
for ``algo.controller.estimator input_dependence``, before every update.

One measurement: ``samples`` rollouts of each of ``input_dependence_tasks`` tasks (the same tasks
all run long, drawn once from the training split), then every response's first turn scored after
every task's prompt in fp32 (n x N rows for n tasks and N responses, no gradients). Like the
target probe's batches these samples are never trained on; the engine draws them in a seeded
scope of their own, so the run's own batches are those it draws without them."""

from __future__ import annotations

import random
import time
from typing import Any

from entrogym.algos import (
    EntropyControl,
    UpdateBatch,
    cross_pairs,
    cross_scores,
    input_dependence,
    input_dependence_per_token,
    retrieval_accuracy,
)
from entrogym.train.config import TrainConfig
from entrogym.train.devices import distributed
from entrogym.train.devices.distributed import Ranks
from entrogym.train.folder.rng import iteration_seed
from entrogym.train.learner.update import Learner
from entrogym.train.phases import PhaseClock
from entrogym.train.sampler.engine import Sampler

# The probe draws its fixed tasks as iteration INPUT_PROBE_ITERATION would, and its samples of
# iteration i as INPUT_PROBE_ITERATION + 1 + i: past any run's own draws.
INPUT_PROBE_ITERATION = 3 * 10**6


def input_probe_due(cfg: TrainConfig, control: EntropyControl, it: int) -> bool:
    """Whether iteration ``it`` measures the input dependence: every iteration for a controller
    that tracks it, else every ``input_dependence_every`` (0: never)."""
    every = cfg.input_dependence_every
    return control.tracks_input_dependence or (every > 0 and it % every == 0)


def score_input_dependence(
    learner: Learner, batch: UpdateBatch, pad_id: int = 0
) -> dict[str, float]:
    """The input-dependence metrics of ``batch`` (sampled episodes of n tasks, one group each):
    every first turn scored after every task's prompt by the learner (``cross_pairs``), as
    ``input_dependence`` (nats per response), ``input_dependence_per_token`` (nats per token) and
    ``input_retrieval`` (the share of responses their own prompt scores highest; chance is
    1/n)."""
    pairs = cross_pairs(batch, pad_id)
    logprobs, _ = learner.score_all(pairs, need_entropy=False)
    scores, lengths = cross_scores(logprobs, pairs)
    tasks = batch.group_ids
    return {
        "input_dependence": input_dependence(scores, tasks),
        "input_dependence_per_token": input_dependence_per_token(scores, lengths, tasks),
        "input_retrieval": retrieval_accuracy(scores, tasks),
    }


def measure_input_dependence(
    it: int, cfg: TrainConfig, control: EntropyControl, sampler: Sampler, learner: Learner,
    ranks: Ranks, phases: PhaseClock,
) -> dict[str, Any]:  # fmt: skip
    """Iteration ``it``'s input-dependence metrics (empty when not due: ``input_probe_due``),
    measured on the current weights before the update, and handed to a controller that tracks
    it. ``input_dependence_s``: the measurement's wall time, sampling and scoring."""
    if not input_probe_due(cfg, control, it):
        return {}
    t0 = time.perf_counter()
    batch, stats = distributed.on_main(lambda: probe_samples(sampler, it), ranks)
    phases.add("generation", stats["generate_s"])
    phases.add("env", stats["env_s"])
    metrics = score_input_dependence(learner, batch, sampler.pad_id)
    if control.tracks_input_dependence:
        control.observe_states(metrics["input_dependence"])
    return {**metrics, "input_tasks": batch.n_groups,
            "input_dependence_s": time.perf_counter() - t0}  # fmt: skip


def probe_samples(sampler: Sampler, it: int) -> tuple[UpdateBatch, dict[str, Any]]:
    """Rank 0: the probe's samples of iteration ``it``: ``samples`` rollouts of each of the
    ``input_dependence_tasks`` probe tasks by the current weights (version ``it``). The tasks
    are the same every iteration (drawn as iteration ``INPUT_PROBE_ITERATION`` would); the
    sampling stream and env seeds are iteration ``INPUT_PROBE_ITERATION + 1 + it``'s, in a
    seeded scope that leaves the engine's stream for the next batch as it was (``hf``)."""
    cfg = sampler.cfg
    seed = iteration_seed(cfg.seed, INPUT_PROBE_ITERATION)
    tasks = random.Random(seed).sample(sampler.tasks, cfg.input_dependence_tasks)
    draw = INPUT_PROBE_ITERATION + 1 + it
    stream = sampler.engine.seeded(iteration_seed(cfg.seed, draw))
    what = f"iteration {it}'s input-dependence probe"
    return sampler.rollouts(draw, tasks, version=it, adapter=None, temperature=cfg.temperature,
                            stream=stream, what=what, label="probe samples")  # fmt: skip
