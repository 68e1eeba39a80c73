"""Exact centring of REPO's log-prob (``repo_centering: exact``, log pi + H) in the bandit lab."""

from __future__ import annotations

import numpy as np
import pytest

from entrogym.theory.lab import LabConfig, run_one
from entrogym.theory.sweep import run_sweep


def _final_ratio(label: str, lab: LabConfig, seeds: int = 3) -> float:
    ratios = []
    for seed in range(seeds):
        initial, rows = run_one(label, seed, lab)
        ratios.append(rows[-1]["entropy"] / initial["entropy"])
    return float(np.mean(ratios))


def _numbers(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "algo"} for row in rows]


def test_raw_centring_reproduces_the_default_runs_exactly() -> None:
    lab = LabConfig(iters=5, n_states=4, n_arms=6, samples_per_state=4)
    for preset in ("repo-r (zeta_init=0.5 zeta_max=0.5)", "repo-d (zeta_max=0.5)"):
        name, knobs = preset.split(" (")
        raw = f"{name} ({knobs[:-1]} repo_centering=raw)"
        assert _numbers(run_one(raw, 0, lab)[1]) == _numbers(run_one(preset, 0, lab)[1])


def test_exact_centring_changes_repo_only() -> None:
    lab = LabConfig(iters=5, n_states=4, n_arms=6, samples_per_state=4)
    plain = run_one("repo-r (zeta_init=0.5 zeta_max=0.5)", 0, lab)[1]
    exact = run_one("repo-r (zeta_init=0.5 zeta_max=0.5 repo_centering=exact)", 0, lab)[1]
    assert [r["entropy"] for r in exact] != [r["entropy"] for r in plain]
    # the same knob lab-wide: REPO presets take it, the others run unchanged
    shared = LabConfig(
        iters=5, n_states=4, n_arms=6, samples_per_state=4, algos=["grpo", "repo-d"],
        knobs={"repo_centering": "exact"},
    )  # fmt: skip
    shared.validate()
    assert run_one("grpo", 0, shared)[1] == run_one("grpo", 0, lab)[1]
    assert shared.algorithm("repo-d").repo_centering == "exact"
    assert shared.algorithm("grpo").repo_centering == "raw"


def test_lab_numbers_repo_d_at_zeta_half_and_lr_64() -> None:
    """The documented lab result (defaults: 3 seeds, 50 iterations, SGD lr 64): REPO-D with
    zeta <= 0.5 keeps 0.80 of its entropy raw and about 0.95 with exact centring."""
    lab = LabConfig()
    raw = _final_ratio("repo-d (zeta_max=0.5)", lab)
    exact = _final_ratio("repo-d (zeta_max=0.5 repo_centering=exact)", lab)
    assert raw == pytest.approx(0.798, abs=0.005)
    assert exact == pytest.approx(0.951, abs=0.01)


def test_repo_centering_is_sweepable() -> None:
    base = LabConfig(iters=5, n_states=4, n_arms=6, samples_per_state=4)
    grid = {"algo.repo_centering": ["raw", "exact"], "algo.zeta_max": [0.5]}
    table = run_sweep(["repo-d"], grid, seeds=1, base=base, workers=1)
    assert [row["algo.repo_centering"] for row in table] == ["raw", "exact"]
    raw, exact = table
    initial, rows = run_one("repo-d (zeta_max=0.5 repo_centering=exact)", 0, base)
    assert exact["entropy_ratio"] == pytest.approx(rows[-1]["entropy"] / initial["entropy"])
    assert raw["entropy_ratio"] != exact["entropy_ratio"]
    with pytest.raises(ValueError, match="repo-r, repo-d"):
        run_sweep(["grpo"], {"algo.repo_centering": ["raw", "exact"]}, seeds=1, base=base)
