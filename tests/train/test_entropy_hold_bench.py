"""benchmarks/entropy_hold.py: its bad input, its JSON and the demo's goal in its verdict, TRL's
target taken from the first logged entropy, and (tiny-random-llama) entrogym's and TRL's runs
end to end, TRL's adapters scored by entrogym's evaluation.

The TRL run needs ``.venv-bench`` (``make test`` builds it); without it that test FAILS with the
command that builds it, instead of skipping."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import entropy_hold  # noqa: E402
import iteration  # noqa: E402
import trl_entropy  # noqa: E402

from entrogym.experiments import SAMPLES, TASKS, tracking  # noqa: E402

TINY = ["--model", "tiny-random-llama", "--eval-tasks", "2"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runs", "grpo --algo.lever nope"], "unknown lever 'nope'"),
        (["--runs", "no-such-preset"], "--runs 'no-such-preset'"),
        (["--trl-delta", "fast"], "--trl-delta 'fast': give numbers"),
        (["--trl-delta", "0.005,-1"], "every delta must be > 0"),
        (["--seeds", "0", "0"], "--seeds: give distinct seeds"),
        (["--iterations", "0"], "--iterations must be >= 1"),
        (["--workers", "99"], "--workers must be from 1 to"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys) -> None:
    assert entropy_hold.main([*argv, "--no-trl"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("entropy_hold: ")


def test_a_used_out_folder_and_a_missing_trl_env_are_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "old.txt").write_text("keep me")
    assert entropy_hold.main(["--out", str(tmp_path), "--no-trl"]) == 2
    assert "is not empty" in capsys.readouterr().err and (tmp_path / "old.txt").exists()
    monkeypatch.setattr(iteration, "BENCH_PYTHON", tmp_path / "missing" / "python")
    assert entropy_hold.main([]) == 2
    assert "make entropy-hold, or pass --no-trl" in capsys.readouterr().err


def test_first_logged_entropy_becomes_trls_target() -> None:
    args = SimpleNamespace(entropy_target=0.2)  # TRL's default until the first log
    tracker = trl_entropy.FirstEntropyTarget()
    assert tracker.observe(args, {"loss": 0.1}) is None and args.entropy_target == 0.2
    assert tracker.observe(args, {"entropy": 2.01, "reward": 0.25}) == 2.01
    assert args.entropy_target == 2.01
    assert tracker.observe(args, {"entropy": 1.5, "reward": 0.5}) == 2.01  # set once
    assert tracker.observe(args, {"train_runtime": 9.0, "entropy": 1.0}) == 2.01
    assert args.entropy_target == 2.01 and [r["entropy"] for r in tracker.rows] == [2.01, 1.5]


def record(label: str, entropy: list[float], accuracy: float, framework: str = "trl") -> dict:
    """A record as the runners return it (``train_one``, ``run_trl_job``)."""
    return {"label": label, "seed": 0, "algo": framework, "entropy": entropy,
            "entropy_ratio": entropy[-1] / entropy[0], "reward": [0.2] * len(entropy),
            "zeta": [0.0] * len(entropy), "entropy_target": [entropy[0]] * len(entropy),
            "controlled": label != "grpo", "accuracy_first": 0.5, "accuracy_after": accuracy,
            "generated_tokens": 100, "wall_s": 3.0}  # fmt: skip


def test_json_rows_and_the_verdict_use_the_demos_goal() -> None:
    grpo = record("grpo", [2.0, 1.8, 1.2, 0.6], 0.8, framework="grpo")
    inside = record("trl inside", [2.0, 1.2, 1.6, 2.3], 0.78)  # 2nd iteration not tracked
    leaves = record("trl leaves", [2.0, 2.0, 2.6, 2.0], 0.9)  # 1.3x at the 3rd iteration
    out = entropy_hold.summarize([grpo, inside, leaves], {"seeds": [0]})
    json.dumps(out)  # one JSON document
    keys = {"label", "seed", "entropy", "entropy_target", "tracking_error", "max_excursion",
            "reward", "accuracy", "wall_s", "tokens_generated"}  # fmt: skip
    assert all(keys <= set(r) for r in out["runs"])
    assert [r["framework"] for r in out["runs"]] == ["entrogym", "trl", "trl"]
    for r, rec in zip(out["runs"], (grpo, inside, leaves), strict=True):
        assert (r["tracking_error"], r["max_excursion"]) == tuple(tracking(rec).values())
        assert r["accuracy"] == {"first": 0.5, "last": rec["accuracy_after"]}
    verdict = out["verdict"]["0"]
    assert verdict["trl inside"]["holds"] and verdict["trl inside"]["in_band"]
    assert not verdict["trl leaves"]["holds"] and not verdict["trl leaves"]["in_band"]
    assert verdict["trl leaves"]["max_excursion"] == pytest.approx(0.3)
    assert out["goal"]["held"] == {"trl inside": True, "trl leaves": False}
    low = record("trl low", [2.0, 2.0, 2.0, 2.0], 0.7)  # accuracy 0.1 below GRPO's
    assert not entropy_hold.summarize([grpo, low], {})["verdict"]["0"]["trl low"]["accurate"]


def test_entrogym_rows_end_to_end_on_a_tiny_model(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    argv = [*TINY, "--no-trl", "--seeds", "0", "--iterations", "1", "--runs", "grpo",
            "--runs", "repo-r", "--workers", "1", "--out", str(out)]  # fmt: skip
    assert entropy_hold.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)  # stdout: the JSON document only
    assert printed == json.loads((out / "entropy_hold.json").read_text())
    grpo, repo = printed["runs"]
    assert (grpo["label"], repo["label"]) == ("grpo", "repo-r")
    assert len(grpo["entropy"]) == 1 and grpo["tokens_generated"] > 0
    assert 0.0 <= repo["accuracy"]["last"] <= 1.0
    assert set(printed["verdict"]["0"]) == {"repo-r"}
    assert printed["settings"]["trl_deltas"] == [] and (out / "seed0" / "grpo").is_dir()
    # both frameworks' workload is the demo's (TRL's is built from the same settings)
    assert (printed["settings"]["tasks"], printed["settings"]["samples"]) == (TASKS, SAMPLES)


def test_trls_adaptive_entropy_run_is_scored_by_entrogyms_grader(tmp_path) -> None:
    problem = iteration.bench_env_problem()
    assert problem is None, f"TRL's environment is missing ({problem}); build it: make test"
    ns = argparse.Namespace(model="tiny-random-llama", tasks=2, samples=2, natural_lengths=True,
                            iterations=2, seed=0, device="cpu", dtype="fp32", threads=1)  # fmt: skip
    work = iteration.build_workload(ns)
    work.settings["max_response_tokens"] = 8
    work.save(tmp_path / "workload.json")
    job = entropy_hold.TrlJob("trl", 0, 1, 0.05, str(tmp_path / "workload.json"),
                              str(tmp_path / "trl"), eval_tasks=2, model="tiny-random-llama")  # fmt: skip
    r = entropy_hold.run_trl_job(job)
    assert len(r["entropy"]) == len(r["reward"]) == len(r["zeta"]) == 2
    assert r["entropy_target"] == [r["entropy"][0]] * 2  # the first iteration's logged entropy
    assert (
        r["trl"]["defaults"]["entropy_coef_max"] == 1.0 and r["trl"]["entropy_coef_delta"] == 0.05
    )
    # one log per iteration: the mean of its two steps' coefficients. The 1st iteration ran at
    # TRL's default target 0.2 (entropy above it: the coefficient stays at 0); from the 2nd on
    # each step adds or removes delta against the first entropy: 0, 0.05 or 0.1 after a step
    assert r["zeta"][0] == 0.0
    assert any(r["zeta"][1] == pytest.approx(v) for v in (0.0, 0.025, 0.075))
    for name in ("adapter-first", "adapter-last"):
        assert (tmp_path / "trl" / name / "adapter_config.json").exists()
    assert 0.0 <= r["accuracy_first"] <= 1.0 and 0.0 <= r["accuracy_after"] <= 1.0
    assert r["generated_tokens"] > 0 and r["controlled"]
