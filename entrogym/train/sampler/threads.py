"""How an async run's rollout thread and learner share the CPU cores (``--max-staleness`` with the
in-process ``hf`` engine, whose generation and the update then run at the same time).

Each side's cost is measured in core-seconds, its phases' seconds times the threads it ran them
on, summed over the iterations so far. The split gives the rollout thread the number of cores
that brings the two sides' times closest, assuming each scales linearly with its threads (the
cost divided by the threads: the most that more threads can buy). It is re-chosen after every
iteration, only with ``--thread-split cost``: the learner's thread count then follows timings,
and torch's CPU gradients differ in their last bits between thread counts (measured: 5.5e-5
between 1 and 2 threads on SmolLM2's LoRA gradients), so such a run is not reproducible bit
for bit. ``even`` keeps half and half, the split for a run that must be. With ``--threads`` set
the learner keeps it and nothing is re-chosen, under any split; on two cores every split is
one core each.

``--thread-split elastic``, the default, keeps ``even``'s shares while both sides run, and gives
the learner every core while the rollout thread has nothing to do: once it has collected the
batches the staleness bound allows, it waits for the update to publish the next version, and a
learner slower than the rollouts (the 2-core CPU case: the update is most of an iteration)
would otherwise leave those cores idle. The learner takes its count as each of its phases
starts (scoring, forward, backward, optimizer: a micro-batch at most), so the rollouts of a new
version share the cores with it for at most the rest of one micro-batch. Its thread counts
follow timings, so, like ``cost``, it is not reproducible bit for bit. It is the default
because half and half leaves a core idle whenever one side waits: on two cores an async run
with ``even`` was slower than the synchronous loop (docs/results.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from entrogym.train.config import ThreadSplitName

# The phases each side spends its threads on (``entrogym.train.phases``): env steps run in
# their own processes, and publishing is a file write.
ROLLOUT_PHASES = ("generation",)
LEARNER_PHASES = ("scoring", "forward", "backward", "optimizer")


def balanced_split(cores: int, rollout_core_s: float, learner_core_s: float) -> tuple[int, int]:
    """``(rollout threads, learner threads)``: the rollout thread's ``e`` in ``1 .. cores - 1``
    minimising ``max(rollout_core_s / e, learner_core_s / (cores - e))``, the slower side's
    seconds when each side's work divides evenly over its threads; a tie goes to the split
    nearest half and half. Fewer than 2 cores: one thread each (they share the core)."""
    if cores < 2:
        return 1, 1

    def cost(e: int) -> tuple[float, int]:
        return max(rollout_core_s / e, learner_core_s / (cores - e)), abs(2 * e - cores)

    e = min(range(1, cores), key=cost)
    return e, cores - e


class ThreadSplit:
    """The current split and the costs behind it. The training loop calls :meth:`observe`
    with each iteration's ``phases_s`` (it then runs its update on ``learner`` threads); the
    rollout thread calls :meth:`apply_rollout` before each batch. With ``split="elastic"``
    the learner's phase clock also calls :meth:`phase_started` and :meth:`phase_ended`
    (``entrogym.train.phases``), and :meth:`watch` says when the rollout thread is busy."""

    def __init__(
        self, cores: int, learner_threads: int | None = None, *, split: ThreadSplitName = "cost"
    ) -> None:
        self.cores = cores
        self.split = split
        # --threads (the user's, kept) or even / elastic: the shares are never re-chosen
        self.fixed = learner_threads is not None or split != "cost"
        # elastic widens the learner only where no --threads caps it
        self.elastic = split == "elastic" and learner_threads is None
        self.learner = learner_threads or max(1, cores // 2)
        self.rollout = max(1, cores - self.learner)
        self.rollout_core_s = 0.0
        self.learner_core_s = 0.0
        self.all_cores_s = 0.0  # elastic: learner seconds on every core, since the last row
        self._rollout_applied: int | None = None
        self._rollout_busy: Callable[[], bool] = lambda: True
        self._learner_thread: int | None = None
        self._learner_now = self.learner

    def start(self) -> None:
        """In the learner's thread, before the first update: its OpenMP team's size."""
        self._learner_thread = threading.get_ident()
        self._learner_now = self.learner
        torch.set_num_threads(self.learner)

    def watch(self, rollout_busy: Callable[[], bool]) -> None:
        """``rollout_busy()``: whether the rollout thread is collecting a batch now."""
        self._rollout_busy = rollout_busy

    def apply_rollout(self) -> None:
        """In the rollout thread, before each batch (torch's thread count is per thread)."""
        if self._rollout_applied != self.rollout:
            torch.set_num_threads(self.rollout)
            self._rollout_applied = self.rollout

    def phase_started(self, phase: str) -> None:
        """Elastic: as a learner phase starts in the learner's thread, every core if the
        rollout thread is idle, else the learner's share."""
        if not self._elastic_learner_phase(phase):
            return
        n = self.learner if self._rollout_busy() else self.cores
        if n != self._learner_now:
            torch.set_num_threads(n)
            self._learner_now = n

    def phase_ended(self, phase: str, seconds: float, info: dict[str, Any]) -> None:
        """Elastic: count the learner's seconds on every core (a phase hook)."""
        if self._elastic_learner_phase(phase) and self._learner_now == self.cores:
            self.all_cores_s += seconds

    def _elastic_learner_phase(self, phase: str) -> bool:
        return (
            self.elastic
            and phase in LEARNER_PHASES
            and threading.get_ident() == self._learner_thread
        )

    def observe(self, phases_s: dict[str, float]) -> None:
        """Add an iteration's costs at the current split's threads (a batch collected ahead
        may have run on the split before), and re-choose the split."""
        self.rollout_core_s += self.rollout * sum(phases_s.get(p, 0.0) for p in ROLLOUT_PHASES)
        self.learner_core_s += self.learner * sum(phases_s.get(p, 0.0) for p in LEARNER_PHASES)
        if self.fixed or not (self.rollout_core_s > 0 and self.learner_core_s > 0):
            return
        rollout, learner = balanced_split(self.cores, self.rollout_core_s, self.learner_core_s)
        if learner != self.learner:
            torch.set_num_threads(learner)  # the caller is the learner's thread
        self.rollout, self.learner = rollout, learner

    def row(self) -> dict[str, Any]:
        """The metrics row's record of the split (``threads_rollout``, ``threads_learner``;
        elastic: ``learner_all_cores_s``, the update's seconds on every core since the last
        row)."""
        row: dict[str, Any] = {"threads_rollout": self.rollout, "threads_learner": self.learner}
        if self.elastic:
            row["learner_all_cores_s"] = round(self.all_cores_s, 3)
            self.all_cores_s = 0.0
        return row
