"""Where an iteration's time goes: wall seconds per phase, and hooks that watch each phase.

Every train row carries ``phases_s`` (seconds per phase) next to ``iteration_s``:

================  ===========================================================================
phase             what is timed
================  ===========================================================================
``generation``    the engine's ``generate`` calls of the iteration's rollouts
``env``           env ``reset`` / ``step`` calls (for the math envs: answer grading)
``scoring``       log-prob passes without gradients (old log-probs, the sampler's version)
``forward``       the loss's scoring passes (with gradients)
``backward``      back-propagation of the micro-batch losses
``optimizer``     unscale, gradient clipping and the optimizer step
``publish``       writing the adapter the engine samples the next rollouts with
================  ===========================================================================

A hook is ``hook(phase, seconds, info)``, called as each timed block ends; ``info`` holds what
the block worked on (for ``scoring`` and ``forward``: the ``batch`` and the row ``index``), so
a benchmark can count FLOPs of the real trainer without patching it
(``benchmarks/bench_entrogym.py``). A start hook, ``start(phase)``, is called as a timed block
begins, in the thread that runs it (an async run's elastic split of the cores sets the
learner's threads there: ``entrogym.train.sampler.threads``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

PHASES = ("generation", "env", "scoring", "forward", "backward", "optimizer", "publish")
PhaseHook = Callable[[str, float, dict[str, Any]], None]
StartHook = Callable[[str], None]


class PhaseClock:
    """Accumulates one iteration's seconds per phase; ``take`` returns and clears them.

    ``sync`` (e.g. ``torch.cuda.synchronize``) runs before each reading, so that queued GPU
    work is charged to the phase that queued it."""

    def __init__(self, hooks: tuple[PhaseHook, ...] = (), sync: Callable[[], Any] | None = None):
        self.hooks = list(hooks)
        self.start_hooks: list[StartHook] = []
        self.sync = sync
        self.seconds: dict[str, float] = {}

    def watch(self, start: StartHook, end: PhaseHook) -> None:
        """Call ``start(phase)`` as each timed block begins and ``end`` as it ends."""
        self.start_hooks.append(start)
        self.hooks.append(end)

    @contextlib.contextmanager
    def time(self, phase: str, **info: Any) -> Iterator[None]:
        """Charge the block's wall time to ``phase``."""
        for hook in self.start_hooks:
            hook(phase)
        if self.sync is not None:
            self.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync is not None:
                self.sync()
            self.add(phase, time.perf_counter() - t0, **info)

    def add(self, phase: str, seconds: float, **info: Any) -> None:
        """Charge ``seconds`` measured elsewhere (e.g. by the rollout loop) to ``phase``."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}")
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
        for hook in self.hooks:
            hook(phase, seconds, info)

    def take(self) -> dict[str, float]:
        """The seconds of every phase since the last ``take`` (0 for phases that did not run)."""
        out = {phase: round(self.seconds.get(phase, 0.0), 4) for phase in PHASES}
        self.seconds = {}
        return out
