"""The async run's split of the cores (``entrogym.train.sampler.threads``) against an
independent computation: with each side's time its core-seconds over its threads, the best
integer split is the floor or the ceiling of the continuous optimum cores * G / (G + L)."""

from __future__ import annotations

import math
import random
import threading

import pytest
import torch

from entrogym.train.sampler.threads import ThreadSplit, balanced_split


def _continuous_optimum(cores: int, g: float, learner: float) -> float:
    """Where g / e = learner / (cores - e): both sides finish together."""
    return cores * g / (g + learner)


def test_the_split_is_next_to_the_continuous_optimum():
    rng = random.Random(0)
    for _ in range(500):
        cores = rng.randint(2, 64)
        g, learner = rng.uniform(0.01, 100), rng.uniform(0.01, 100)
        e, rest = balanced_split(cores, g, learner)
        assert e + rest == cores and 1 <= e <= cores - 1
        star = min(max(_continuous_optimum(cores, g, learner), 1), cores - 1)
        assert e in (math.floor(star), math.ceil(star))
        slower = max(g / e, learner / rest)
        # no other split finishes both sides sooner
        assert all(slower <= max(g / x, learner / (cores - x)) + 1e-12 for x in range(1, cores))


@pytest.mark.parametrize(
    ("cores", "g", "learner", "want"),
    [
        (2, 9.0, 1.0, (1, 1)),
        (16, 3.0, 1.0, (12, 4)),
        (16, 1.0, 1.0, (8, 8)),
        (1, 5.0, 1.0, (1, 1)),
        (4, 1.0, 100.0, (1, 3)),
    ],  # fmt: skip
)
def test_known_splits(cores, g, learner, want):
    assert balanced_split(cores, g, learner) == want


def test_the_split_follows_the_measured_costs_and_keeps_a_users_threads():
    before = torch.get_num_threads()
    try:
        split = ThreadSplit(16)
        assert (split.rollout, split.learner) == (8, 8)  # half and half before any cost
        split.observe({"generation": 3.0, "env": 50.0, "scoring": 0.25, "forward": 0.25,
                       "backward": 0.5, "publish": 9.0})  # fmt: skip
        # 8 x 3 core-seconds against 8 x 1: three quarters of the cores to the rollouts
        assert (split.rollout, split.learner) == (12, 4)
        assert torch.get_num_threads() == 4  # the learner's thread took its share
        assert split.row() == {"threads_rollout": 12, "threads_learner": 4}
        fixed = ThreadSplit(16, learner_threads=5)
        fixed.observe({"generation": 3.0, "forward": 1.0})
        assert (fixed.rollout, fixed.learner) == (11, 5)  # --threads: the user's split stays
        even = ThreadSplit(16, split="even")
        even.observe({"generation": 3.0, "forward": 1.0})
        assert (even.rollout, even.learner) == (8, 8)  # --thread-split even: half and half
    finally:
        torch.set_num_threads(before)


def test_elastic_keeps_a_users_threads():
    before = torch.get_num_threads()
    try:
        split = ThreadSplit(4, learner_threads=1, split="elastic")
        split.start()
        split.watch(lambda: False)  # the rollout thread idles
        split.phase_started("forward")
        split.phase_ended("forward", 2.0, {})
        assert torch.get_num_threads() == 1  # --threads 1 caps the learner: no widening
        assert split.row() == {"threads_rollout": 3, "threads_learner": 1}
    finally:
        torch.set_num_threads(before)


def test_elastic_gives_the_learner_every_core_while_the_rollout_thread_idles():
    before = torch.get_num_threads()
    busy = [True]
    try:
        split = ThreadSplit(4, split="elastic")
        split.start()  # this thread is the learner's
        split.watch(lambda: busy[0])
        assert torch.get_num_threads() == 2 and split.fixed  # even's shares, never re-chosen
        split.phase_started("scoring")
        split.phase_ended("scoring", 1.5, {})
        assert torch.get_num_threads() == 2  # the rollout thread is collecting: the share
        busy[0] = False
        split.phase_started("forward")
        assert torch.get_num_threads() == 4  # it waits for a version: every core
        split.phase_ended("forward", 2.0, {})
        split.phase_started("generation")  # not a learner phase: the count stays
        assert torch.get_num_threads() == 4
        busy[0] = True
        seen: list[int] = []

        def other_thread() -> None:  # a phase timed outside the learner's thread is not its
            torch.set_num_threads(1)
            split.phase_started("backward")
            seen.append(torch.get_num_threads())

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        assert seen == [1] and torch.get_num_threads() == 4
        split.phase_started("backward")
        assert torch.get_num_threads() == 2  # busy again: back to the share
        split.phase_ended("backward", 4.0, {})
        # only the forward pass ran on every core; the row reports it once
        assert split.row() == {"threads_rollout": 2, "threads_learner": 2,
                               "learner_all_cores_s": 2.0}  # fmt: skip
        assert split.row()["learner_all_cores_s"] == 0.0
        split.observe({"generation": 9.0, "forward": 1.0})  # costs never move its shares
        assert (split.rollout, split.learner) == (2, 2)
    finally:
        torch.set_num_threads(before)


def test_an_unknown_thread_split_is_refused():
    from entrogym.train.config import TrainConfig

    with pytest.raises(ValueError, match="thread_split must be 'even', 'cost' or 'elastic'"):
        TrainConfig(thread_split="fast")  # type: ignore[arg-type]
