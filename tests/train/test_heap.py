"""``entrogym.train.heap``: ``malloc_trim`` hands freed heap pages back to the OS, and the
trainer's hook calls it after the phases that free large buffers only."""

from __future__ import annotations

import platform

import psutil
import pytest
import torch

from entrogym.train.heap import TRIM_AFTER, HeapTrim, malloc_trim
from entrogym.train.phases import PHASES

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


@glibc
def test_malloc_trim_returns_freed_heap_pages():
    trim = malloc_trim()
    assert trim is not None
    # Freeing an mmap'd chunk raises glibc's mmap threshold to its size, so the 4 MB tensors
    # after it come from the heap; the last one alive keeps the heap's top from shrinking.
    big = torch.ones(8 << 18)  # 8 MiB
    del big
    kept = [torch.ones(1 << 20) for _ in range(64)]  # 64 x 4 MiB
    last = kept.pop()
    kept.clear()
    before = _rss_mb()
    trim()
    after = _rss_mb()
    assert before - after > 128, (before, after)
    assert float(last.sum()) == 1 << 20


def test_the_hook_trims_after_the_named_phases_only():
    calls = []
    hook = HeapTrim()
    hook.trim = lambda: calls.append(1)
    for phase in PHASES:
        hook(phase, 0.0, {})
    assert len(calls) == len(TRIM_AFTER)
    assert set(PHASES) >= TRIM_AFTER and "forward" not in TRIM_AFTER  # activations still live
    hook.trim = None  # no malloc_trim in this C library: the hook does nothing
    hook("backward", 0.0, {})
    assert len(calls) == len(TRIM_AFTER)


@pytest.mark.parametrize("staleness", [0, 1], ids=["sync", "async"])
def test_a_synchronous_trainer_frees_the_engines_caches_before_each_update(tmp_path, staleness):
    """Sync: the sampler's merged weights are released once per iteration, after its rollouts
    and before the update's first pass; async: never (rollouts run beside the update)."""
    from vowel_env import TINY_RUN

    from entrogym.train.config import TrainConfig
    from entrogym.train.trainer import Trainer

    events: list[str] = []
    cfg = TrainConfig(
        out=str(tmp_path), **{**TINY_RUN, "iterations": 2, "max_staleness": staleness}
    )
    trainer = Trainer(cfg, hooks=(lambda phase, seconds, info: events.append(phase),))
    try:
        engine = trainer.sampler.engine
        release = engine.release_caches

        def recorded() -> None:
            events.append("release")
            release()

        engine.release_caches = recorded
        trainer.fit()
    finally:
        trainer.close()
    assert sum(isinstance(h, HeapTrim) for h in trainer.phases.hooks) == 1
    if staleness:
        assert "release" not in events
    else:
        assert events.count("release") == 2
        for i, event in enumerate(events):
            if event == "release":
                assert events[i - 1] == "env" and events[i + 1] in ("scoring", "forward")
    no_trim = Trainer(TrainConfig(out=str(tmp_path / "off"), **{**TINY_RUN, "trim_heap": False}))
    no_trim.close()
    assert not any(isinstance(h, HeapTrim) for h in no_trim.phases.hooks)
