"""The rollout pipeline on its own: which version samples which iteration, that the rollout
thread never samples with a version that does not exist yet, and that its errors reach the loop."""

from __future__ import annotations

import threading
import time

import pytest

from entrogym.commands.train import parse_config
from entrogym.train.sampler.pipeline import RolloutPipeline, sampling_version


def test_sampling_version_is_k_behind_and_never_below_the_floor():
    assert [sampling_version(i, 0) for i in range(4)] == [0, 1, 2, 3]
    assert [sampling_version(i, 2) for i in range(5)] == [0, 0, 0, 1, 2]
    assert [sampling_version(i, 2, floor=5) for i in (6, 7, 8)] == [5, 5, 6]


@pytest.mark.parametrize("k", [1, 2])
def test_the_rollout_thread_waits_for_the_version_it_samples_with(k):
    published = {0}
    calls: list[tuple[int, int, str]] = []

    def collect(it: int, version: int) -> tuple[int, int]:
        assert version in published, f"iteration {it} sampled by unpublished version {version}"
        calls.append((it, version, threading.current_thread().name))
        return it, version

    with RolloutPipeline(collect, max_staleness=k, start=0, stop=6) as pipeline:
        for it in range(6):
            assert pipeline.get(it) == (it, max(0, it - k))
            time.sleep(0.01)  # an update; the thread may run ahead meanwhile, by at most k
            published.add(it + 1)
            pipeline.published(it + 1)
    assert [c[:2] for c in calls] == [(i, max(0, i - k)) for i in range(6)]
    assert {c[2] for c in calls} == {"rollouts"}


def test_the_pipeline_says_when_its_rollout_thread_is_collecting():
    inside: list[bool] = []
    holder: list[RolloutPipeline] = []

    def collect(it: int, version: int) -> int:
        inside.append(holder[0].collecting)
        return it

    holder.append(RolloutPipeline(collect, max_staleness=1, start=0, stop=3))
    with holder[0] as pipeline:  # the thread starts here, with the pipeline at hand
        assert pipeline.get(0) == 0
        assert pipeline.get(1) == 1  # sampled by version 0 as well
        deadline = time.monotonic() + 5
        # batch 2 needs version 1: the thread waits for it, and is not collecting
        while pipeline.collecting and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not pipeline.collecting
        pipeline.published(1)
        assert pipeline.get(2) == 2
    assert inside == [True, True, True]
    assert not pipeline.collecting


def test_synchronous_pipeline_collects_in_the_callers_thread():
    seen = []
    with RolloutPipeline(
        lambda it, v: seen.append((it, v, threading.current_thread().name)),
        max_staleness=0,
        start=3,
        stop=5,
    ) as pipeline:
        for it in (3, 4):
            pipeline.get(it)
    assert seen == [(3, 3, "MainThread"), (4, 4, "MainThread")]


def test_an_error_in_the_rollout_thread_is_raised_by_its_iteration():
    def collect(it: int, version: int) -> int:
        if it == 1:
            raise ValueError("env broke")
        return it

    with RolloutPipeline(collect, max_staleness=1, start=0, stop=4) as pipeline:
        assert pipeline.get(0) == 0
        pipeline.published(1)
        with pytest.raises(ValueError, match="env broke"):
            pipeline.get(1)


def test_bad_staleness_options_are_refused_in_one_line():
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        parse_config(["--max-staleness", "-1"])
    with pytest.raises(ValueError, match="3 weight versions, more than max_loras=2"):
        parse_config(["--max-staleness", "2", "--max-loras", "2"])
    assert parse_config(["--max-staleness", "2", "--max-loras", "3"]).max_staleness == 2
