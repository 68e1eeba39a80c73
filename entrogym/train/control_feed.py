"""What the entropy control is fed beside an iteration's batch, behind one object the recipe
calls at two fixed points: :meth:`ControlFeed.start` before the first update and
:meth:`ControlFeed.before_update` before each.

- The target probe (``algo.controller.target_probe``): batches of the initial policy whose
  entropies the target averages in; with ``estimator probe`` their states are also what the
  controller tracks, rescored before every update and kept in the run's state (a checkpoint
  holds them).
- ``estimator relative``: the batch's exact entropy under the policy over the base model's,
  measured before its update.
- The ``aepo`` lever's samples at the temperature the controller holds, attached to the lever.
- The input dependence of the responses on the task (``entrogym.train.input_probe``): measured
  every ``input_dependence_every`` iterations, and before every update for ``estimator
  input_dependence``, which tracks it.

What to feed is the control's to say (``EntropyControl.probe_request``, ``tracks_probe_states``,
``tracks_relative``, ``tracks_input_dependence``, its lever): this module reads no algorithm
option. Nothing here is trained
on as experience; samples are drawn on rank 0 by the sampler's engine, broadcast to a torchrun
learner, and scored in fp32 by the learner like an iteration's batch.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from entrogym.algos import EntropyControl, UpdateBatch
from entrogym.algos.aepo import Aepo
from entrogym.train.devices import distributed
from entrogym.train.devices.distributed import Ranks
from entrogym.train.folder.rng import iteration_seed
from entrogym.train.folder.safety import adapter_folder
from entrogym.train.folder.state import TrainState
from entrogym.train.input_probe import measure_input_dependence
from entrogym.train.learner.update import Learner
from entrogym.train.phases import PhaseClock
from entrogym.train.progress import progress
from entrogym.train.sampler.engine import Sampler

# The probe batches of a target draw their tasks and seeds as these iterations would: far past
# any run's end, so never a draw the run trains on.
PROBE_ITERATION = 10**6
# The AEPO lever's samples of iteration i draw as iteration TEMPERATURE_ITERATION + i would:
# past the probe's and any run's own draws.
TEMPERATURE_ITERATION = 2 * 10**6


class ControlFeed:
    """The entropy control's own samples and measurements of one run (see the module doc).
    ``state``: the run's state, whose ``probe_states`` keep ``estimator probe``'s states."""

    def __init__(
        self, control: EntropyControl, sampler: Sampler, learner: Learner, ranks: Ranks,
        phases: PhaseClock, state: TrainState,
    ) -> None:  # fmt: skip
        self.control, self.sampler, self.learner = control, sampler, learner
        self.ranks, self.phases, self.state = ranks, phases, state

    def start(self, start: int) -> str | None:
        """Before the first update: the target probe's batches of the weights of version
        ``start`` (none on a resumed run, whose state holds what the probe measured), their
        entropies in the estimator the controller tracks handed to it. Returns the line to
        print (None without a probe)."""
        n = self.control.probe_request
        if not n:
            return None
        t0 = time.perf_counter()
        batches = distributed.on_main(lambda: self._probe_batches(n, start), self.ranks)
        entropies = [self.learner.probe_entropy(batch, self.control) for batch in batches]
        self.control.observe_probe(entropies)
        if self.control.tracks_probe_states:  # its fixed states, which a checkpoint keeps
            self.state.probe_states = states_to_dict(batches)
        listed = ", ".join(f"{h:.3f}" for h in entropies)
        return (f"target probe: {n} batches of the initial policy, entropy {listed} nats "
                f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip

    def before_update(self, it: int, batch: UpdateBatch) -> dict[str, Any]:
        """Before iteration ``it``'s update on ``batch``: the ``aepo`` lever's samples (drawn
        by the current weights, attached to the lever) and the input dependence when due,
        then what the controller tracks when the update does not estimate it
        (``observe_states``): the input dependence, the probe states' entropy under the policy
        being trained, or ``batch``'s relative to the base model. Returns their metrics."""
        row = self._temperature_samples(it)
        row |= measure_input_dependence(  # when due, on the current weights
            it, self.sampler.cfg, self.control, self.sampler, self.learner, self.ranks, self.phases
        )
        if self.control.tracks_probe_states:
            states = states_from_dict(self.state.probe_states)
            entropies = [self.learner.probe_entropy(state, self.control) for state in states]
            self.control.observe_states(sum(entropies) / len(entropies))
        elif self.control.tracks_relative:  # measured on this batch, before its update
            self.control.observe_states(*self.learner.relative_entropy(batch))
        return row

    # ----- the target probe -----------------------------------------------------------------

    def _probe_batches(self, n: int, start: int) -> list[UpdateBatch]:
        """Rank 0: ``n`` batches of the weights of version ``start``, drawn as the iterations
        from ``PROBE_ITERATION`` on would draw them. With the ``hf`` engine they leave the
        run's own samples as they would be without them: the engine samples them in a seeded
        scope from a copy of the adapter, so neither its random stream nor the set of
        adapters it holds is changed for the run."""
        sampler = self.sampler
        with tempfile.TemporaryDirectory(prefix="entrogym-probe-") as tmp:
            copy = shutil.copytree(adapter_folder(sampler.run_dir, start), Path(tmp) / "adapter")
            batches = []
            draws = range(PROBE_ITERATION + 1, PROBE_ITERATION + n + 1)
            for it in progress(draws, desc="target probe", unit="batches"):
                with sampler.engine.seeded(iteration_seed(sampler.cfg.seed, it)):
                    batches.append(sampler.collect(it, version=start, adapter=copy)[0])
        return batches

    # ----- AEPO's samples at temperature T --------------------------------------------------

    def _temperature_samples(self, it: int) -> dict[str, Any]:
        """The ``aepo`` lever's samples (``entrogym.algos.aepo``): drawn by the current weights
        at the temperature T the controller holds now, for ``share`` of the iteration's
        tasks, and attached to the lever with the learner's fp32 scoring. Their metrics (T,
        how many, their mean reward); empty for other levers."""
        lever = self.control.lever
        if not isinstance(lever, Aepo):
            return {}
        temperature = float(self.control.coefficient)
        share = lever.params.share
        batch, stats = distributed.on_main(
            lambda: self._temperature_batch(it, temperature, share), self.ranks
        )
        self.phases.add("generation", stats["generate_s"])
        self.phases.add("env", stats["env_s"])
        lever.attach(self.learner.temperature_samples(batch))
        return {
            "aepo_temperature": temperature,
            "aepo_samples": len(batch),
            "aepo_reward": float(batch.rewards.mean()),
        }

    def _temperature_batch(
        self, it: int, temperature: float, share: float
    ) -> tuple[UpdateBatch, dict[str, Any]]:
        """Rank 0: the first ``ceil(share * tasks_per_iter)`` of iteration ``it``'s tasks,
        ``samples`` each, drawn at ``temperature`` by the current weights (version ``it``).
        They draw their sampling stream and env seeds as iteration ``TEMPERATURE_ITERATION +
        it`` would, so never what the run's own batches draw, in a seeded scope that leaves
        the engine's stream for the next batch as it was (``hf``)."""
        sampler, cfg = self.sampler, self.sampler.cfg
        tasks = sampler.tasks_of(it)[: math.ceil(share * cfg.tasks_per_iter)]
        draw = TEMPERATURE_ITERATION + it
        stream = sampler.engine.seeded(iteration_seed(cfg.seed, draw))
        what = f"iteration {it}'s AEPO samples at temperature {temperature:g}"
        return sampler.rollouts(draw, tasks, version=it, adapter=None, temperature=temperature,
                                stream=stream, what=what)  # fmt: skip


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
