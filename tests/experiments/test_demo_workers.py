"""The demo's default pool size: one job more than the cores, at most one per job."""

from __future__ import annotations

import os

import pytest

from entrogym.experiments.run import default_workers


@pytest.mark.parametrize(("cores", "jobs", "want"), [(2, 8, 3), (2, 2, 2), (16, 6, 6), (1, 5, 2)])
def test_one_job_more_than_the_cores(monkeypatch, cores: int, jobs: int, want: int) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert default_workers(jobs) == want
