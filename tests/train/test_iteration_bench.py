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
import bench_report  # noqa: E402
import iteration  # noqa: E402

from entrogym.train.learner.policy import load_base_model  # noqa: E402


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


@pytest.mark.parametrize("native", [True, False])
def test_an_emulated_bf16_ceiling_is_measured_small(monkeypatch, tmp_path, native):
    """Without native bf16, torch's reference GEMM makes the 2048-wide measurement take minutes
    for the rate a 256-wide one gives; fp32 keeps its size either way."""
    calls = []
    monkeypatch.setattr(bench_entrogym, "cpu_has_native", lambda dtype: native)
    monkeypatch.setattr(bench_entrogym, "matmul_ceiling", lambda *a, **kw: calls.append((a, kw)))
    bench_entrogym._ceilings(_workload(tmp_path))
    (fp32, fp32_kw), (bf16, bf16_kw) = calls
    assert fp32[0] is torch.float32 and bf16[0] is torch.bfloat16
    assert fp32_kw == {}
    assert bf16_kw == ({} if native else {"n": 256, "reps": 2})


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
    cfg = bench_entrogym.train_config(work, bench_entrogym.BenchOptions(scoring=scoring), tmp_path)
    assert (cfg.score_layout, cfg.action_only_head) == (layout, action_only)
    assert (cfg.dtype, cfg.threads, cfg.engine) == ("bf16", 1, "hf")
    assert (cfg.tasks_per_iter, cfg.samples, cfg.micro_batch_size) == (2, 2, 2)
    algo = cfg.algo
    assert (algo.name, algo.epochs, algo.minibatch_size) == ("grpo", 1, 2)
    assert cfg.max_staleness == 0
    cfg = bench_entrogym.train_config(
        work, bench_entrogym.BenchOptions(scoring=scoring, max_staleness=1), tmp_path
    )
    assert cfg.max_staleness == 1


def test_worker_command_line_maps_onto_bench_options():
    """iteration.py passes options to the worker by command line; each lands on its field, and
    an option left out keeps BenchOptions' default."""
    work, result, opts = bench_entrogym.parse_args(["w.json", "r.json"])
    assert (str(work), str(result), opts) == ("w.json", "r.json", bench_entrogym.BenchOptions())
    argv = ["w.json", "r.json", "--scoring", "exact", "--env-workers", "3", "--max-staleness",
            "1", "--no-trim-heap", "--thread-split", "even", "--old-logprobs", "sampler"]  # fmt: skip
    _, _, opts = bench_entrogym.parse_args(argv)
    assert opts == bench_entrogym.BenchOptions(
        scoring="exact", env_workers=3, max_staleness=1, trim_heap=False, thread_split="even",
        old_logprobs="sampler",
    )  # fmt: skip


def test_worker_runs_the_trainers_fit_and_reports_its_phases(tmp_path):
    work = _workload(tmp_path, "--threads", "1")
    out = bench_entrogym.run(work, bench_entrogym.BenchOptions())
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
    assert (out["engine"], out["engine_dtype"]) == ("hf", "fp32")  # the demo's sampler


def test_async_worker_runs_rollouts_beside_the_update_at_full_length(tmp_path):
    args = ["--model", "tiny-random-llama", "--tasks", "2", "--samples", "2", "--iterations", "2"]
    work = iteration.build_workload(iteration.parse_args(args))
    out = bench_entrogym.run(
        work, bench_entrogym.BenchOptions(max_staleness=1, thread_split="elastic")
    )
    first, second = out["iterations"]
    assert not first["beside"] and second["beside"]  # iteration 1 trains on version 0's batch
    assert "wait" in second["phases_s"] and "wait" not in first["phases_s"]
    # the last update runs with no batch left to collect: on every core, and counted
    learner_s = sum(second["phases_s"][p] for p in ("scoring", "forward", "backward", "optimizer"))
    assert 0 < second["learner_all_cores_s"] <= learner_s + 0.01
    # EOS ignored: every completion runs to the budget, so the work is known in advance
    budget = work.settings["max_response_tokens"]
    assert first["generated_tokens"] == second["generated_tokens"] == 2 * 2 * budget


def test_old_logprobs_sampler_reaches_both_runs_and_drops_the_scoring_pass(tmp_path):
    args = iteration.parse_args(["--model", "tiny-random-llama", "--old-logprobs", "sampler"])
    assert args.old_logprobs == "sampler"
    work = _workload(tmp_path, "--threads", "1")
    cfg = bench_entrogym.train_config(
        work, bench_entrogym.BenchOptions(old_logprobs="sampler"), tmp_path
    )
    assert cfg.old_logprobs == "sampler"
    out = bench_entrogym.run(work, bench_entrogym.BenchOptions(old_logprobs="sampler"))
    (it,) = out["iterations"]
    # two minibatches: the learner scored the second one's rows without gradients before
    assert it["phases_s"].get("scoring", 0.0) == 0.0 and it["phases_s"]["forward"] > 0
    assert it["sampler_mismatch"] is None  # nothing compared


def _worker_result(seconds, gen, learn, load=1.0, phases=True):
    it = {"seconds": seconds, "generated_tokens": gen, "learner_tokens": learn}
    if phases:
        it |= {"phases_s": {"generation": 8.0}, "generated_tokens_per_s": 100.0,
               "learner_tokens_per_s": 300.0, "learner_gflops_per_s": 150.0,
               "sampler_mismatch": 1e-6}  # fmt: skip
    return {"iterations": [it, it, it], "peak_rss_mb": 3000.0, "startup_s": 6.0, "threads": 2,
            "ceiling_gflops": {"fp32": 300.0, "bf16": 900.0}, "load_1min": load}  # fmt: skip


def test_report_gives_every_ratio_flags_outliers_and_checks_equal_work():
    runs = {
        "entrogym": [_worker_result(s, 1152, 4000) for s in (20.0, 21.0, 19.0, 50.0)],
        "entrogym_async": [_worker_result(s, 1152, 4000) for s in (12.0, 12.5, 13.0, 12.0)],
        "trl": [_worker_result(s, 1140, 4100, phases=False) for s in (40.0, 41.0, 39.0, 40.0)],
    }
    args = iteration.parse_args(["--model", "tiny-random-llama"])
    report = bench_report.build_report(runs, args, {})
    assert report["speedup_vs_trl"] == round(40.0 / 20.5, 3)
    assert report["speedup_vs_trl_async"] == round(40.0 / 12.25, 3)
    assert report["async_vs_sync"] == round(20.5 / 12.25, 3)
    per_gen = (40.0 / 1140) / (20.5 / 1152)
    assert report["speedup_vs_trl_per_generated_token"] == round(per_gen, 3)
    assert report["speedup_vs_trl_per_learner_token"] == round((40 / 4100) / (20.5 / 4000), 3)
    assert "speedup_vs_trl_async_per_learner_token" in report
    assert report["equal_work"] == {"generated_tokens_ratio": round(1152 / 1140, 4),
                                    "within_2_percent": True}  # fmt: skip
    for side in ("entrogym", "trl"):
        assert report[side]["generated_tokens_per_iteration"] > 0
        assert report[side]["learner_tokens_per_iteration"] > 0
    assert [r["flagged"] for r in report["entrogym"]["repetitions"]] == [False] * 3 + [True]
    text = bench_report.table(report)
    assert "| entrogym sync | 20.5 | 20.0 (1.0), 21.0 (1.0), 19.0 (1.0), 50.0 (1.0)! |" in text
    assert "| TRL | 40.0 |" in text and "| entrogym async | 12.2 |" in text
    assert "speedup_vs_trl_async 3.265" in text and "more than 2x the median" in text


def test_timed_iteration_is_the_middle_one():
    assert bench_report.timed_index(3) == 1 and bench_report.timed_index(2) == 1
    assert bench_report.timed_index(1) == 0 and bench_report.timed_index(5) == 1


def _rates(dtype="fp32", flop=1000.0, byte=400.0):
    return {"dtype": dtype, "roofline": {"matmul_gflops": 50.0, "read_gb_s": 10.0, "batch": 24,
            "context": 80.0, "flop_bound_tokens_per_s": flop, "byte_bound_tokens_per_s": byte}}  # fmt: skip


def test_report_gives_the_generation_roofline_and_its_rows():
    runs = {"entrogym": [_worker_result(s, 1152, 4000) for s in (20.0, 21.0, 19.0)]}
    row = _rates("bf16", flop=2000.0, byte=800.0) | {
        "engine": "hf", "tokens_per_s": 200.0, "startup_s": 0.5,
        "repetitions": [{"tokens_per_s": t, "seconds": 5.0, "load_1min": 1.5} for t in (190, 200, 210)],
    }  # fmt: skip
    rows = [row, {"engine": "vllm", "dtype": "fp32", "skipped": "vllm is not installed"}]
    args = iteration.parse_args(["--model", "tiny-random-llama"])
    report = bench_report.build_report(runs, args, {}, {"rates": _rates(), "rows": rows})
    sync = report["entrogym"]
    # the sync run's generation, 100 tok/s, over the lower (byte) bound of its dtype's rates
    assert sync["generation_roofline_fraction"] == round(100.0 / 400.0, 3)
    assert sync["generation_roofline"]["engine_dtype"] == "fp32"
    assert sync["generation_roofline"]["read_gb_s"] == 10.0  # the bound's inputs beside it
    timed, skipped = report["generation_rows"]
    assert timed["generation_roofline_fraction"] == 0.25 and timed["dtype"] == "bf16"
    assert skipped == {"engine": "vllm", "dtype": "fp32", "skipped": "vllm is not installed"}
    text = bench_report.table(report)
    assert "roofline: entrogym sync generation (fp32 sampler) 100 tok/s = 0.250 of" in text
    assert "| hf | bf16 | 200 | 190 (1.5), 200 (1.5), 210 (1.5) | 0.5 | 0.250 |" in text
    assert "| vllm | fp32 | skipped: vllm is not installed |" in text


def test_a_row_that_cannot_run_says_why_in_one_line(monkeypatch):
    import importlib.util

    from entrogym import dtypes

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n))
    assert "vllm is not installed" in iteration.row_problem("vllm", "fp32")
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: frozenset({"avx2"}))
    assert "no native bf16" in iteration.row_problem("hf", "bf16")
    assert iteration.row_problem("hf", "fp32") is None
    failed = SystemExit("benchmark worker x failed (1):\nTraceback\n  ...\nValueError: no luck\n")
    assert iteration.last_line(failed) == "ValueError: no luck"


def test_the_roofline_rows_are_on_by_default_and_can_be_narrowed():
    args = iteration.parse_args([])
    assert args.roofline_rows and args.roofline_engines == ["hf", "vllm"]
    assert args.roofline_dtypes == ["fp32", "bf16"]
    args = iteration.parse_args(["--no-roofline-rows", "--roofline-engines", "hf"])
    assert not args.roofline_rows and args.roofline_engines == ["hf"]


def test_generation_worker_reports_rates_bounds_and_timed_repetitions(tmp_path):
    import bench_generation

    work = _workload(tmp_path, "--threads", "1")
    prompts = bench_generation.timed_prompts(work)
    assert len(prompts) == 2 * 2 and prompts[0] == prompts[1]  # each task `samples` times
    bound = bench_generation.roofline_inputs(work, "fp32", prompts)
    assert bound["batch"] == 4 and bound["itemsize"] == 4 and bound["matmul_gflops"] > 0
    out = bench_generation.time_generation(work, "hf", "fp32", prompts, reps=3)
    assert len(out["repetitions"]) == 3 and out["startup_s"] >= 0
    budget = work.settings["max_response_tokens"]
    assert all(r["tokens"] == 4 * budget for r in out["repetitions"])  # ignore_eos: full length
    assert out["tokens_per_s"] == sorted(r["tokens_per_s"] for r in out["repetitions"])[1]
