"""benchmarks/bench_multiturn.py (make bench's multi-turn row): its bad input, its ratios on
made-up results, the conversation env both frameworks train, and (tiny-random-llama) entrogym's
loops and TRL's ``environment_factory`` loop end to end on equal work.

The TRL run needs ``.venv-bench`` (``make test`` builds it); without it that test FAILS with the
command that builds it, instead of skipping."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_multiturn  # noqa: E402
import iteration  # noqa: E402
import multiturn_env  # noqa: E402

from entrogym.envs.base import make_text_env  # noqa: E402


def _opts(**kw) -> argparse.Namespace:
    base = dict(turns=2, latency_ms=[0.0], sweep_turns=[], sweep_trl=True, tasks=2, samples=2,
                turn_tokens=4, context=512, iterations=1, model="tiny-random-llama", reps=1,
                threads=1, seed=0, timeout=600.0, frameworks=list(bench_multiturn.FRAMEWORKS),
                old_logprobs="learner")  # fmt: skip
    return argparse.Namespace(**(base | kw))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"turns": 0}, "must be >= 1"),
        ({"sweep_turns": [1, 0]}, "must be >= 1"),
        ({"latency_ms": [-5.0]}, "--latency-ms must be >= 0"),
        ({"tasks": 3, "samples": 1}, "must be even"),
    ],
)
def test_bad_input_is_refused_in_one_line(kw, message):
    with pytest.raises(SystemExit, match=message) as info:
        bench_multiturn.check(_opts(**kw))
    assert "\n" not in str(info.value)


def test_multiturn_without_trl_is_refused_before_any_model_loads():
    with pytest.raises(SystemExit, match="add --vs-trl"):
        iteration.main(["--multiturn", "--model", "tiny-random-llama"])


def test_iteration_options_reach_the_multiturn_workload():
    args = iteration.parse_args(["--multiturn", "--multiturn-turns", "3", "--multiturn-latency-ms",
                                 "50", "--multiturn-sweep-turns", "1", "8", "--reps", "4"])  # fmt: skip
    opts = bench_multiturn.options(args, "multiturn-")
    assert (opts.turns, opts.latency_ms, opts.sweep_turns, opts.reps) == (3, [50.0], [1, 8], 4)
    assert (opts.old_logprobs, opts.frameworks) == ("learner", list(bench_multiturn.FRAMEWORKS))


def test_cells_cover_the_comparison_and_the_sweep_once():
    cells = bench_multiturn.cells(_opts(turns=4, latency_ms=[0.0, 100.0], sweep_turns=[1, 4]))
    assert len(cells) == len(set(cells))
    assert {("entrogym_async", 4, 100.0), ("trl", 4, 100.0), ("trl", 1, 0.0)} <= set(cells)
    assert ("entrogym_async", 1, 0.0) not in cells  # the sweep is sync and TRL only
    assert len(cells) == 3 * 2 + 2 * 2 - 2  # (entrogym, 4, 0) and (trl, 4, 0) counted once
    ours = bench_multiturn.cells(
        _opts(sweep_turns=[1, 8], sweep_trl=False, frameworks=["entrogym"])
    )
    assert ours == [("entrogym", 2, 0.0), ("entrogym", 1, 0.0), ("entrogym", 8, 0.0)]


def _run(seconds: float, generated: int, tokens_per_s: float | None = None) -> dict:
    it = {"seconds": seconds, "generated_tokens": generated, "learner_tokens": 2 * generated}
    if tokens_per_s is not None:
        it |= {"phases_s": {"generation": generated / tokens_per_s}, "generated_tokens_per_s":
               tokens_per_s, "learner_tokens_per_s": 1.0, "learner_gflops_per_s": 1.0,
               "sampler_mismatch": 0.0}  # fmt: skip
    return {"iterations": [it], "load_1min": 0.5, "peak_rss_mb": 100.0, "startup_s": 1.0,
            "threads": 2, "ceiling_gflops": {"fp32": 10.0}}  # fmt: skip


def test_report_ratios_from_made_up_results():
    opts = _opts(turns=4, latency_ms=[0.0, 100.0], sweep_turns=[1, 4])
    runs = {
        ("entrogym", 4, 0.0): [_run(2.0, 400, 200.0)] * 3,
        ("entrogym_async", 4, 0.0): [_run(2.0, 400, 200.0)] * 3,
        ("trl", 4, 0.0): [_run(6.0, 400)] * 3,
        ("entrogym", 4, 100.0): [_run(4.0, 400, 200.0)] * 3,
        ("entrogym_async", 4, 100.0): [_run(2.5, 400, 200.0)] * 3,
        ("trl", 4, 100.0): [_run(12.0, 404)] * 3,
        ("entrogym", 1, 0.0): [_run(1.0, 100, 250.0)] * 3,
        ("trl", 1, 0.0): [_run(2.0, 100)] * 3,
    }
    out = bench_multiturn.report(runs, opts)
    assert out["speedup_vs_trl"] == {"0ms": 3.0, "100ms": 3.0}
    assert out["async_vs_sync"] == {"0ms": 1.0, "100ms": 1.6}
    assert out["turn_cost_ratio"] == 0.8  # 200 tok/s at 4 turns over 250 at 1
    assert out["trl_turn_cost_ratio"] == round((400 / 6) / (100 / 2), 3)
    assert out["equal_work"]["4 turns 0ms"]["within_2_percent"]
    assert out["equal_work"]["4 turns 100ms"]["generated_tokens_ratio"] == round(400 / 404, 4)
    assert "| trl | 4 | 100 ms | 12.0 |" in bench_multiturn.table(out)


def test_talk_tools_env_runs_every_turn_through_the_tool(monkeypatch):
    """Whatever the model writes, each turn but the last is one call to say (with its latency),
    the last calls nothing, and get_reward scores what was said."""
    monkeypatch.setenv(multiturn_env.LATENCY_VARIABLE, "20")
    rows = [{"prompt": [{"role": "user", "content": "Conversation 000: hi."}]}]
    env = make_text_env("multiturn_env:TalkTools-v0", dataset=rows, max_turns=3)
    obs, info = env.reset(options={"task_id": "train-0"})
    assert "Conversation 000" in obs and [t["function"]["name"] for t in info["tools"]] == ["say"]
    t0 = time.perf_counter()
    for action, done in (("hello", False), ("<tool_call>{broken", False), ("bye", True)):
        obs, reward, terminated, truncated, _ = env.step(action)
        assert (terminated or truncated) == done
        if not done:
            assert obs == multiturn_env.REPLY
    assert time.perf_counter() - t0 >= 0.04  # two calls of 20 ms, none on the last turn
    said = env.unwrapped.inner.said
    assert said == ["hello", "<tool_call>{broken"]
    assert reward == float(sum(map(len, said)) % 2)


def test_both_loops_run_equal_multiturn_work_end_to_end():
    """entrogym sync, async and TRL's environment_factory loop on tiny-random-llama: every
    episode runs every turn to the token budget on each side."""
    problem = iteration.bench_env_problem()
    assert problem is None, f"TRL's benchmark env is missing ({problem}); build it: make bench"
    opts = _opts()
    out = bench_multiturn.measure(opts)
    cells = {(c["framework"], c["turns"]): c for c in out["cells"]}
    assert set(cells) == {("entrogym", 2), ("entrogym_async", 2), ("trl", 2)}
    episodes = opts.tasks * opts.samples
    for cell in cells.values():
        assert cell["generated_tokens_per_iteration"] == episodes * 2 * opts.turn_tokens
    assert out["equal_work"]["2 turns 0ms"]["within_2_percent"]
    assert out["speedup_vs_trl"]["0ms"] > 0 and out["async_vs_sync"]["0ms"] > 0
