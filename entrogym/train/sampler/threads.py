"""How an async run's rollout thread and learner share the CPU cores (``--max-staleness`` with the
in-process ``hf`` engine, whose generation and the update then run at the same time).

Each side's cost is measured in core-seconds, its phases' seconds times the threads it ran them
on, summed over the iterations so far. The split gives the rollout thread the number of cores
that brings the two sides' times closest, assuming each scales linearly with its threads (the
cost divided by the threads: the most that more threads can buy). It is re-chosen after every
iteration, only with ``--thread-split cost``: the learner's thread count then follows timings,
and torch's CPU gradients differ in their last bits between thread counts (measured: 5.5e-5
between 1 and 2 threads on SmolLM2's LoRA gradients), so such a run is not reproducible bit
for bit. The default, ``even``, keeps half and half. With ``--threads`` set the learner keeps
it and nothing is re-chosen; on two cores every split is one core each.
"""

from __future__ import annotations

from typing import Any

import torch

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
    rollout thread calls :meth:`apply_rollout` before each batch."""

    def __init__(
        self, cores: int, learner_threads: int | None = None, *, by_cost: bool = True
    ) -> None:
        self.cores = cores
        # --threads (the user's, kept) or --thread-split even: never re-chosen
        self.fixed = learner_threads is not None or not by_cost
        self.learner = learner_threads or max(1, cores // 2)
        self.rollout = max(1, cores - self.learner)
        self.rollout_core_s = 0.0
        self.learner_core_s = 0.0
        self._rollout_applied: int | None = None

    def start(self) -> None:
        """In the learner's thread, before the first update: its OpenMP team's size."""
        torch.set_num_threads(self.learner)

    def apply_rollout(self) -> None:
        """In the rollout thread, before each batch (torch's thread count is per thread)."""
        if self._rollout_applied != self.rollout:
            torch.set_num_threads(self.rollout)
            self._rollout_applied = self.rollout

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
        """The metrics row's record of the split (``threads_rollout``, ``threads_learner``)."""
        return {"threads_rollout": self.rollout, "threads_learner": self.learner}
