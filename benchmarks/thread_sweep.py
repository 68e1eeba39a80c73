"""What 4 and 16 cores would do for the benchmark's iteration, projected from 1 and 2 threads
measured on this machine.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/thread_sweep.py --reps 3 > sweep.json
    PYTHONPATH=$PWD .venv/bin/python benchmarks/thread_sweep.py --inputs t1.json t2.json

A 2-core machine cannot time 4 or 16 threads, so this measures what it can and states a model
for the rest. ``iteration.py`` times the synchronous loop's phases at ``--threads 1`` and
``--threads 2`` (fresh processes, medians of ``--reps``, each with its load average; no async
run, no TRL). Each phase is then fitted with Amdahl's law (Amdahl 1967, "Validity of the single
processor approach to achieving large scale computing capabilities"):

    t(n) = s + w / n,   from t(1) and t(2):   w = 2 (t(1) - t(2)),   s = t(1) - w

(``s`` clamped to [0, t(1)]: a phase that did not speed up is all serial, one that more than
halved all parallel). Two points fit two unknowns exactly, so the fit has no residual to judge
it by: the projection is a model, not a measurement, and it leaves out what more cores change
besides the thread count (caches, memory channels, the OpenMP barrier's cost).

Generation is also bounded by reading the weights once per decode step (``roofline.py``): at
``n`` threads it cannot take less than the steps' bytes over the read bandwidth measured here,
on 2 cores. A larger machine usually has more bandwidth, so this floor is pessimistic; the
report gives generation with and without it.

The synchronous loop runs its phases one after another on all ``n`` threads. The asynchronous
loop (``--max-staleness 1``) runs the rollout side (generation and env) on ``r`` threads beside
the learner (scoring, forward, backward, optimizer, publish) on ``n - r``; an iteration takes
the slower side. The report gives the best integer split under the model and the split
``entrogym.train.sampler.threads.balanced_split`` (``--thread-split cost``) picks from the
sides' measured 1-thread core-seconds. For ``--thread-split elastic`` (the default: the even
shares while both sides run, every core to the update once the rollouts end) an iteration is
the rollout side's ``R`` on its share, then what the update has left on all ``n`` threads:
``R + (1 - R / L(n - r)) L(n)`` where the update, ``L(k)`` seconds on ``k`` threads, is
longer than ``R`` (its work taken as evenly divisible), else ``R``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from entrogym.train.sampler.threads import balanced_split

HERE = Path(__file__).resolve().parent
ROLLOUT = ("generation", "env")
LEARNER = ("scoring", "forward", "backward", "optimizer", "publish")
CORES = (1, 2, 4, 8, 16)


def amdahl_fit(t1: float, t2: float) -> tuple[float, float]:
    """``(serial, parallel)`` seconds of a phase timed ``t1`` on 1 thread and ``t2`` on 2, so
    that ``serial + parallel / n`` passes through both (clamped as the module docstring says)."""
    parallel = min(max(2.0 * (t1 - t2), 0.0), t1)
    return t1 - parallel, parallel


def phase_seconds(fit: tuple[float, float], threads: int) -> float:
    """A fitted phase's seconds on ``threads`` threads."""
    serial, parallel = fit
    return serial + parallel / threads


def fits(phases_1: dict[str, float], phases_2: dict[str, float]) -> dict[str, tuple[float, float]]:
    """Every phase timed at both thread counts, fitted."""
    return {k: amdahl_fit(phases_1[k], phases_2[k]) for k in phases_1 if k in phases_2}


def side_seconds(
    phase_fits: dict[str, tuple[float, float]],
    names: tuple[str, ...],
    threads: int,
    generation_floor_s: float = 0.0,
) -> float:
    """The named phases' projected seconds on ``threads`` threads, generation held at or above
    ``generation_floor_s``."""
    total = 0.0
    for name in names:
        if name in phase_fits:
            seconds = phase_seconds(phase_fits[name], threads)
            total += max(seconds, generation_floor_s) if name == "generation" else seconds
    return total


def project(
    phase_fits: dict[str, tuple[float, float]], cores: int, generation_floor_s: float = 0.0
) -> dict[str, Any]:
    """The synchronous and asynchronous iteration on ``cores`` cores under the model."""
    other = tuple(k for k in phase_fits if k not in ROLLOUT + LEARNER)
    every = ROLLOUT + LEARNER + other
    sync = side_seconds(phase_fits, every, cores, generation_floor_s)
    out: dict[str, Any] = {"cores": cores, "sync_s": round(sync, 2)}
    if cores < 2:
        return out

    def iteration(rollout_threads: int) -> float:
        rollout = side_seconds(phase_fits, ROLLOUT, rollout_threads, generation_floor_s)
        learner = side_seconds(phase_fits, LEARNER + other, cores - rollout_threads)
        return max(rollout, learner)

    def elastic(rollout_threads: int) -> float:
        # both sides on their shares until the rollouts end; the update's remaining work then
        # runs on every core (``--thread-split elastic``), its work taken as evenly divisible
        rollout = side_seconds(phase_fits, ROLLOUT, rollout_threads, generation_floor_s)
        shared = side_seconds(phase_fits, LEARNER + other, cores - rollout_threads)
        if shared <= rollout:
            return rollout
        return rollout + (1 - rollout / shared) * side_seconds(phase_fits, LEARNER + other, cores)

    best = min(range(1, cores), key=iteration)
    picked, _ = balanced_split(
        cores, side_seconds(phase_fits, ROLLOUT, 1), side_seconds(phase_fits, LEARNER + other, 1)
    )
    even = max(1, cores - max(1, cores // 2))
    out.update(
        async_even_s=round(iteration(even), 2),
        async_cost_split=[picked, cores - picked],
        async_cost_s=round(iteration(picked), 2),
        async_best_split=[best, cores - best],
        async_best_s=round(iteration(best), 2),
        async_cost_vs_sync=round(sync / iteration(picked), 3),
        async_elastic_split=[even, cores - even],
        async_elastic_s=round(elastic(even), 2),
        async_elastic_vs_sync=round(sync / elastic(even), 3),
    )
    return out


def generation_floor(sync_report: dict[str, Any]) -> float:
    """Seconds the timed iteration's generation cannot go below at the read bandwidth measured
    in the same run: its tokens over the byte bound's tokens/s (0 where not measured)."""
    bound = sync_report.get("generation_roofline")
    if not bound:
        return 0.0
    return sync_report["generated_tokens_per_iteration"] / bound["byte_bound_tokens_per_s"]


def sweep(report_1: dict[str, Any], report_2: dict[str, Any]) -> dict[str, Any]:
    """The projection from two ``iteration.py`` reports (1 and 2 threads)."""
    sync_1, sync_2 = report_1["entrogym"], report_2["entrogym"]
    phase_fits = fits(sync_1["phases_s"], sync_2["phases_s"])
    floor = generation_floor(sync_2)
    return {
        "measured": {
            str(r["threads"]): {
                "median_seconds_per_iteration": r["median_seconds_per_iteration"],
                "phases_s": r["phases_s"],
                "repetitions": r["repetitions"],
            }
            for r in (sync_1, sync_2)
        },
        "fits": {
            k: {"serial_s": round(s, 3), "parallel_s": round(w, 3)}
            for k, (s, w) in phase_fits.items()
        },
        "generation_floor_s": round(floor, 3),
        "projection": [project(phase_fits, n) for n in CORES],
        "projection_with_floor": [project(phase_fits, n, floor) for n in CORES],
    }


def table(result: dict[str, Any]) -> str:
    """Markdown: cores, sync, async (cost split), the split, with and without the floor."""
    lines = [
        "| cores | sync s | async s (cost split) | split r+l | async/sync | async s (elastic) "
        "| async/sync (elastic) | sync s, read floor | async s, read floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for free, floored in zip(result["projection"], result["projection_with_floor"], strict=True):
        split = "+".join(map(str, free.get("async_cost_split", []))) or "-"
        lines.append(
            f"| {free['cores']} | {free['sync_s']} | {free.get('async_cost_s', '-')} | {split} "
            f"| {free.get('async_cost_vs_sync', '-')} | {free.get('async_elastic_s', '-')} "
            f"| {free.get('async_elastic_vs_sync', '-')} | {floored['sync_s']} "
            f"| {floored.get('async_cost_s', '-')} |"
        )
    return "\n".join(lines)


def measure(threads: int, reps: int) -> dict[str, Any]:
    """``iteration.py`` at ``threads`` threads, synchronous loop only."""
    command = [sys.executable, str(HERE / "iteration.py"), "--threads", str(threads)]
    command += ["--reps", str(reps), "--async-staleness", "0", "--no-roofline-rows"]
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=3, help="iteration.py repetitions per thread count")
    p.add_argument(
        "--inputs",
        nargs=2,
        type=Path,
        metavar=("T1_JSON", "T2_JSON"),
        help="project from two saved iteration.py reports (1 and 2 threads) instead of timing",
    )
    args = p.parse_args(argv)
    if args.inputs:
        reports = [json.loads(path.read_text()) for path in args.inputs]
    else:
        reports = [measure(threads, args.reps) for threads in (1, 2)]
    if [r["entrogym"]["threads"] for r in reports] != [1, 2]:
        p.error("the two reports must be iteration.py runs at --threads 1 and --threads 2")
    result = {"inputs": reports, **sweep(*reports)}
    print(json.dumps(result, indent=1))
    print(table(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
