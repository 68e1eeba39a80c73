"""examples/custom_entropy_control.py: a new lever is one class plus one registry line, and a
user reaches it through ``entrogym train --algo.lever module:name``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from entrogym.algos import ALGORITHMS, LEVERS, build_algorithm
from entrogym.experiments.lab import run_one
from entrogym.experiments.lab_config import LabConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "custom_entropy_control.py"
LEVER = "custom_entropy_control:sampled-entropy-bonus"


def test_the_examples_lever_keeps_entropy_in_the_bandit_lab(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    lab = LabConfig(seeds=2, iters=25)
    bonus = build_algorithm({"name": "dapo", "lever": LEVER, "controller": {"init": 0.05}})
    assert LEVERS.get(LEVER).name == "sampled-entropy-bonus"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = {"dapo": [run_one(ALGORITHMS["dapo"], s, lab) for s in range(2)],
                "bonus": [run_one(bonus, s, lab) for s in range(2)]}  # fmt: skip
    finally:
        torch.set_num_threads(threads)

    def final(name: str) -> float:
        return sum(rows[-1]["entropy"] for _, rows in runs[name]) / 2

    assert runs["dapo"][0][0] == runs["bonus"][0][0]  # same problems per seed
    assert all(row["beta"] == 0.05 for _, rows in runs["bonus"] for row in rows)
    assert final("bonus") > final("dapo") + 0.2  # the bonus keeps entropy
    assert runs["bonus"][0][1][-1]["reward"] > 0.8


@pytest.mark.slow
def test_the_example_trains_smollm2_through_entrogym_train(tmp_path: Path) -> None:
    """What the example's docstring tells a user to run: 2 iterations of SmolLM2 with GRPO and
    the example's lever, through `entrogym train` (the example runs that command)."""
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("kind", "train") == "train"]
    assert [r["iteration"] for r in train] == [0, 1]
    assert all(r["beta"] == 0.05 and r["algo"] == "grpo" for r in train)
    config = (out / "config.yaml").read_text()
    assert LEVER in config  # the run records the lever by the name a resume imports it by
