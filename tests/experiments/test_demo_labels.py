"""Short run labels (``NAME=SPEC``): parsing, the demo's options, its jobs and its log lines."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from entrogym.commands.demo import DemoOptions
from entrogym.commands.demo_runs import parse_run, split_run
from entrogym.experiments import DEFAULT_RUNS, DEMO_UPDATE
from entrogym.experiments.log_labels import LabelledStream, labelled_output
from entrogym.experiments.run import plan_jobs

HELD = "grpo --algo.lever entropy-constraint --algo.lever.penalty 1"


def test_a_name_prefix_labels_a_run_and_a_plain_spec_keeps_its_own_label() -> None:
    assert split_run(f"held={HELD}") == ("held", HELD)
    assert split_run(f" repo-r2 = {HELD}") == ("repo-r2", HELD)
    # not a NAME=: an option's value, a word with a space, a word that is not identifier-like
    assert split_run("repo-r --algo.controller.init=0.05")[0] == (
        "repo-r --algo.controller.init 0.05"
    )
    for spec in ("two words=grpo", "9lives=grpo", "a.b=grpo"):
        with pytest.raises(ValueError):
            split_run(spec)  # then it is a spec, and not a valid one
    assert split_run("grpo") == ("grpo", "grpo")
    named, plain = parse_run(f"held={HELD}"), parse_run(HELD)
    assert (named.label, named.folder, named.spec) == ("held", "held", HELD)
    assert (plain.label, plain.spec) == ("grpo --algo.lever entropy-constraint --algo.lever.penalty 1.0", HELD)  # fmt: skip
    assert named.spec_folder == plain.folder == "grpo_lever_entropy-constraint_lever.penalty_1.0"
    assert named.algo == plain.algo and named.algo.lever.name == "entropy-constraint"
    # the demo's update, unless the spec sets its own
    assert (plain.algo.epochs, plain.algo.minibatch_size) == tuple(DEMO_UPDATE.values())
    assert parse_run("grpo --algo.epochs 3").algo.epochs == 3


def test_the_default_runs_have_short_distinct_labels() -> None:
    runs = DemoOptions().runs
    assert [run.label for run in runs] == ["grpo", "repo-r", "held"]
    assert [run.text for run in runs] == list(DEFAULT_RUNS)
    assert runs[2].algo.lever.name == "entropy-constraint"


def test_two_runs_under_one_label_are_refused() -> None:
    with pytest.raises(ValueError, match="both labelled 'held'"):
        DemoOptions(algos=[f"held={HELD}", "held=repo-r"])
    with pytest.raises(ValueError, match="both labelled 'grpo'"):
        DemoOptions(algos=["grpo", "grpo"])
    assert DemoOptions(algos=["grpo", "g2=grpo"]).algos == ["grpo", "g2=grpo"]
    with pytest.raises(ValueError, match="'held=nope'"):
        DemoOptions(algos=["held=nope"])


def test_jobs_carry_label_spec_and_short_name(tmp_path: Path) -> None:
    texts = ["grpo", f"held={HELD}", "grpo --algo.lever kl-cov --algo.mask high-entropy"]
    runs = [parse_run(text) for text in texts]
    jobs = plan_jobs(tmp_path, runs, [0, 1], 2, 1e-3, 0, workers=1)
    assert [(j.label, j.seed) for j in jobs][:3] == [
        ("grpo", 0), ("held", 0), ("grpo --algo.lever kl-cov --algo.mask high-entropy", 0)
    ]  # fmt: skip
    assert [j.name for j in jobs[:3]] == ["grpo", "held", "run#3"]
    assert jobs[1].spec == HELD and jobs[0].spec == "grpo"
    assert Path(jobs[1].config.out) == tmp_path / "seed0" / "held"
    assert len({j.config.out for j in jobs}) == len(jobs)  # no two runs share a folder


def test_a_runs_log_lines_carry_its_label_not_the_presets() -> None:
    sink = io.StringIO()
    stream = LabelledStream(sink, "held s0", "grpo")
    print("[grpo] iter 0: reward=0.312", file=stream, flush=True)
    stream.write("iteration 1: all 4 groups have equal rewards\npartial")
    assert sink.getvalue().splitlines() == [
        "[held s0] iter 0: reward=0.312", "[held s0] iteration 1: all 4 groups have equal rewards"
    ]  # fmt: skip
    stream.close_line()
    assert sink.getvalue().splitlines()[-1] == "[held s0] partial"
    assert not stream.isatty()


def test_labelled_output_wraps_both_streams_and_restores_them(capsys) -> None:
    before = sys.stdout, sys.stderr
    with labelled_output("repo-r s1", "repo-r"):
        print("[repo-r] iter 3: entropy=1.0")
        print("warning", file=sys.stderr)
    assert (sys.stdout, sys.stderr) == before
    out, err = capsys.readouterr()
    assert out == "[repo-r s1] iter 3: entropy=1.0\n" and err == "[repo-r s1] warning\n"
