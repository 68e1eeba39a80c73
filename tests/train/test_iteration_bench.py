"""benchmarks/iteration.py: its bad-input messages, the TrainConfig options it sets, the
phases its worker times around the real Trainer, and the FLOP count it reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_common  # noqa: E402
import bench_entrogym  # noqa: E402
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


def _workload(tmp_path, *extra: str) -> bench_common.Workload:
    args = iteration.parse_args(
        ["--model", "tiny-random-llama", "--tasks", "2", "--samples", "2", "--iterations", "1"]
        + list(extra)
    )
    return iteration.build_workload(args)


@pytest.mark.parametrize(
    ("scoring", "layout", "action_only"), [("fast", "trimmed", True), ("exact", "padded", False)]
)
def test_options_reach_the_train_config(tmp_path, scoring, layout, action_only):
    work = _workload(tmp_path, "--dtype", "bf16", "--threads", "1")
    cfg = bench_entrogym.train_config(work, "hf", scoring, tmp_path)
    assert (cfg.score_layout, cfg.action_only_head) == (layout, action_only)
    assert (cfg.dtype, cfg.threads, cfg.engine) == ("bf16", 1, "hf")
    assert (cfg.tasks_per_iter, cfg.samples, cfg.micro_batch_size) == (2, 2, 2)
    algo = cfg.algorithm()
    assert (algo.name, algo.epochs, algo.minibatch_size) == ("grpo", 1, 2)


def test_worker_runs_the_trainers_fit_and_reports_its_phases(tmp_path):
    work = _workload(tmp_path, "--threads", "1")
    out = bench_entrogym.run(work, "hf", "fast")
    (it,) = out["iterations"]
    phases = it["phases_s"]
    for key in ("generation", "env", "forward", "backward", "optimizer", "publish"):
        assert key in phases and phases[key] >= 0, key
    assert "scoring" in phases  # the 2nd minibatch's old log-probs: no grad
    assert phases["forward"] > 0 and phases["backward"] > 0 and phases["generation"] > 0
    assert abs(sum(phases.values()) - it["seconds"]) < 1e-2
    assert it["generated_tokens"] > 0 and it["learner_tokens"] > it["generated_tokens"]
    assert it["learner_gflops_per_s"] > 0
    # the trainer's own mismatch against the sampler stays tiny
    assert it["sampler_mismatch"] < 1e-4
    assert out["threads"] == 1 and out["startup_s"] > 0


def test_table_shows_both_frameworks_and_the_ratios():
    def side(seconds, rss):
        return {"seconds_per_iteration": [seconds, seconds + 1], "peak_rss_mb": rss,
                "median_seconds_per_iteration": seconds, "startup_s": 6.0}  # fmt: skip

    mine = side(19.4, 4051) | {"phases_s": {"generation": 8.2}, "learner_gflops_per_s": 145.0,
                               "ceiling_gflops": {"fp32": 363.9, "bf16": 2224.1}}  # fmt: skip
    report = {"entrogym": mine, "trl": side(24.6, 2818), "learner_ceiling_fraction": 0.39,
              "speedup_vs_trl": 1.27, "speedup_vs_trl_per_rep": [1.4, 1.27], "rss_vs_trl": 1.44}  # fmt: skip
    text = iteration.table(report)
    assert "| entrogym | 19.4 | 19.4, 20.4 | 4051 | 6.0 |" in text
    assert "| TRL | 24.6 |" in text and "speedup_vs_trl 1.27" in text
    assert "generation 8.20" in text and "'fp32': 364" in text
    del report["trl"], report["speedup_vs_trl"]
    assert "TRL" not in iteration.table(report)
