"""benchmarks/iteration.py: its bad-input messages and the FLOP count it reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_common  # noqa: E402
import iteration  # noqa: E402

from entrogym.train.policy import load_base_model  # noqa: E402


def test_vs_trl_without_the_bench_env_names_the_command(monkeypatch, tmp_path):
    monkeypatch.setattr(iteration, "BENCH_PYTHON", tmp_path / "missing" / "python")
    with pytest.raises(SystemExit, match="build it with: make bench"):
        iteration.main(["--vs-trl", "--model", "tiny-random-llama"])


def test_impossible_thread_count_is_refused():
    with pytest.raises(SystemExit, match="--threads must be from 1 to"):
        iteration.main(["--threads", "0"])


def test_flop_count_of_a_tiny_model():
    model = load_base_model("tiny-random-qwen3")
    shape = bench_common.ModelShape.of(model)
    head = model.get_output_embeddings().weight
    assert shape.vocab == head.shape[0] and shape.hidden == head.shape[1]
    total = sum(p.numel() for p in model.parameters())
    assert shape.body_params == total - 2 * head.numel()  # untied: embedding and head excluded
    fwd = shape.forward_flops([10, 4], head_positions=3)
    attention = 2 * shape.layers * shape.hidden * (100 + 16)
    assert fwd == 2 * shape.body_params * 14 + attention + 2 * shape.hidden * shape.vocab * 3
    assert shape.backward_flops([10, 4], 3) == fwd + 4 * shape.hidden * shape.vocab * 3


def test_matmul_ceiling_is_positive():
    assert bench_common.matmul_ceiling(torch.float32, n=128, reps=2) > 0
