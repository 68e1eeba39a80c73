"""One training iteration of the demo's GRPO configuration, phase by phase, optionally side by
side with TRL's ``GRPOTrainer`` on the same work.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/iteration.py --vs-trl --reps 5

Each repetition runs every framework in a fresh process (interleaved, alternating which goes
first), for ``--iterations`` iterations; the last one (warm) is the timed one. Prints JSON:

* ``entrogym``: per phase (the trainer's own ``phases_s``: generation, env, scoring, forward,
  backward, optimizer, publish; other = the rest of the iteration), generated tokens/s, learner tokens/s, learner GFLOP/s
  and the fp32 / bf16 matmul ceilings measured in the same process;
* top level: ``learner_ceiling_fraction`` (learner FLOP/s over the same-run ceiling of the dtype
  the body uses), ``peak_rss_mb`` (process tree), ``startup_s`` (spawn to first rollout), and with
  ``--vs-trl``: ``speedup_vs_trl`` (TRL's median seconds per iteration over entrogym's) and
  TRL's own figures. docs/performance.md explains the FLOP count and the differences.

``--vs-trl`` needs the ``.venv-bench`` environment that ``make bench`` builds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import DEMO, PeakRss, Workload

ROOT = Path(__file__).resolve().parent.parent
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
HERE = Path(__file__).resolve().parent


def bench_env_problem() -> str | None:
    """Why TRL's environment cannot run, or None when it can."""
    if not BENCH_PYTHON.exists():
        return f"{BENCH_PYTHON} does not exist"
    check = subprocess.run(
        [str(BENCH_PYTHON), "-c", "import trl, peft, entrogym"], capture_output=True, text=True
    )
    return None if check.returncode == 0 else check.stderr.strip().splitlines()[-1]


def build_workload(args: argparse.Namespace) -> Workload:
    """The demo's tasks in the order the trainer draws them (Trainer.collect's RNG)."""
    from entrogym.demo import ENV, ENV_KWARGS, SYSTEM_PROMPT
    from entrogym.envs.base import make_text_env, task_ids_of
    from entrogym.models import resolve_model

    settings = dict(DEMO, tasks=args.tasks, samples=args.samples)
    settings["minibatch_size"] = args.tasks * args.samples // 2
    settings["micro_batch_size"] = min(DEMO["micro_batch_size"], settings["minibatch_size"])
    env = make_text_env(ENV, **ENV_KWARGS)
    tasks = task_ids_of(env, "train")
    prompts, answers = [], []
    for it in range(args.iterations):
        for task in random.Random(args.seed * 1_000_003 + it).sample(tasks, args.tasks):
            observation, _ = env.reset(options={"task_id": task})
            prompts.append(
                [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": observation},
                ]
            )
            answers.append(str(env.unwrapped.problem(task).answer))
    env.close()
    return Workload(
        model_dir=str(resolve_model(args.model)),
        prompts=prompts,
        answers=answers,
        iterations=args.iterations,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        seed=args.seed,
        settings=settings,
    )


def run_worker(cmd: list[str], result: Path, timeout: float) -> dict:
    env = dict(os.environ, BENCH_SPAWN_TIME=repr(time.time()))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    rss = PeakRss(proc.pid)
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        peak = rss.stop()
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        tail = output.decode(errors="replace")[-3000:]
        raise SystemExit(f"benchmark worker {cmd[1]} failed ({proc.returncode}):\n{tail}")
    out = json.loads(result.read_text())
    out["peak_rss_mb"] = peak
    return out


def summarize(runs: list[dict], dtype: str, body_key: str = "bf16") -> dict:
    """Medians over repetitions of the timed (last) iteration."""
    last = [r["iterations"][-1] for r in runs]
    out = {
        "seconds_per_iteration": [round(x["seconds"], 3) for x in last],
        "median_seconds_per_iteration": statistics.median(x["seconds"] for x in last),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "startup_s": statistics.median(r["startup_s"] for r in runs),
        "threads": runs[0]["threads"],
        "ceiling_gflops": runs[-1]["ceiling_gflops"],
    }
    if "phases_s" in last[0]:
        med = lambda key: statistics.median(x[key] for x in last)  # noqa: E731
        out["phases_s"] = {
            k: round(statistics.median(x["phases_s"].get(k, 0.0) for x in last), 3)
            for k in last[0]["phases_s"]
        }
        for key in ("generated_tokens_per_s", "learner_tokens_per_s", "learner_gflops_per_s"):
            out[key] = round(med(key), 2)
        ceiling = statistics.median(
            r["ceiling_gflops"]["fp32" if dtype == "fp32" else body_key] for r in runs
        )
        out["learner_ceiling_fraction"] = out["learner_gflops_per_s"] / ceiling
        out["sampler_mismatch"] = [x["sampler_mismatch"] for x in last]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--engine", default="hf", help="entrogym's rollout engine (vllm, hf)")
    p.add_argument(
        "--scoring",
        choices=("exact", "fast"),
        default="fast",
        help="fast: TrainConfig score_layout=trimmed, action_only_head=True (the trainer's "
        "default); exact: score_layout=padded, action_only_head=False",
    )
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="TrainConfig.dtype: the body's dtype (a 16-bit body keeps an fp32 LM head)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--threads", type=int, default=None, help="TrainConfig.threads (default: torch's)"
    )
    p.add_argument("--tasks", type=int, default=DEMO["tasks"])
    p.add_argument("--samples", type=int, default=DEMO["samples"])
    p.add_argument("--iterations", type=int, default=2, help="per process; the last is timed")
    p.add_argument("--reps", type=int, default=3, help="fresh-process repetitions per framework")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--env-workers",
        type=int,
        default=None,
        help="entrogym's env worker processes (0: envs in the trainer; default: the trainer's)",
    )
    p.add_argument("--vs-trl", action="store_true", help="also run TRL's GRPOTrainer (make bench)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker process")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None and not 1 <= args.threads <= (os.cpu_count() or 1):
        raise SystemExit(f"--threads must be from 1 to {os.cpu_count()}, got {args.threads}")
    if args.vs_trl and (problem := bench_env_problem()):
        raise SystemExit(
            f"--vs-trl needs TRL's benchmark environment ({problem}); build it with: make bench"
        )
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: CUDA is not available here; use --device cpu")
    load = {"before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="iteration-bench-") as tmp:
        work_file, result = Path(tmp) / "workload.json", Path(tmp) / "result.json"
        work = build_workload(args)
        work.save(work_file)
        ours = [
            sys.executable,
            str(HERE / "bench_entrogym.py"),
            str(work_file),
            str(result),
            "--engine",
            args.engine,
            "--scoring",
            args.scoring,
            *([] if args.env_workers is None else ["--env-workers", str(args.env_workers)]),
        ]
        theirs = [str(BENCH_PYTHON), str(HERE / "bench_trl.py"), str(work_file), str(result)]
        runs: dict[str, list[dict]] = {"entrogym": [], "trl": []}
        for rep in range(args.reps):
            order = [("entrogym", ours), ("trl", theirs)] if args.vs_trl else [("entrogym", ours)]
            for name, cmd in order if rep % 2 == 0 else order[::-1]:
                runs[name].append(run_worker(cmd, result, args.timeout))
    load["after"] = os.getloadavg()
    mine = summarize(runs["entrogym"], args.dtype)
    report = {
        "learner_ceiling_fraction": round(mine["learner_ceiling_fraction"], 3),
        "peak_rss_mb": round(mine["peak_rss_mb"]),
        "startup_s": round(mine["startup_s"], 2),
        "config": {k: v for k, v in vars(args).items()} | {"settings": work.settings},
        "load_average": load,
        "entrogym": mine,
    }
    if args.vs_trl:
        trl = summarize(runs["trl"], "fp32")
        report["speedup_vs_trl"] = round(
            trl["median_seconds_per_iteration"] / mine["median_seconds_per_iteration"], 3
        )
        ratios = [
            t["iterations"][-1]["seconds"] / e["iterations"][-1]["seconds"]
            for t, e in zip(runs["trl"], runs["entrogym"], strict=True)
        ]
        report["speedup_vs_trl_per_rep"] = [round(r, 3) for r in ratios]
        report["rss_vs_trl"] = round(mine["peak_rss_mb"] / trl["peak_rss_mb"], 3)
        report["trl"] = trl
    print(json.dumps(report, indent=1))
    print(table(report), file=sys.stderr)  # for people; stdout stays one JSON document
    return 0


def table(report: dict) -> str:
    """The report as a markdown table: one row per framework, then the ratios."""
    rows = [("entrogym", report["entrogym"])] + (
        [("TRL", report["trl"])] if "trl" in report else []
    )
    lines = ["| framework | s / iter (median) | per repetition | peak RSS MB | start-up s |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, r in rows:
        reps = ", ".join(f"{x:.1f}" for x in r["seconds_per_iteration"])
        lines.append(f"| {name} | {r['median_seconds_per_iteration']:.1f} | {reps} | "
                     f"{r['peak_rss_mb']:.0f} | {r['startup_s']:.1f} |")  # fmt: skip
    mine = report["entrogym"]
    if "phases_s" in mine:
        phases = ", ".join(f"{k} {v:.2f}" for k, v in mine["phases_s"].items())
        lines.append(f"\nentrogym phases (s): {phases}")
        lines.append(f"learner_ceiling_fraction {report['learner_ceiling_fraction']:.2f} "
                     f"({mine['learner_gflops_per_s']:.0f} GFLOP/s; ceilings "
                     f"{ {k: round(v) for k, v in mine['ceiling_gflops'].items()} })")  # fmt: skip
    if "speedup_vs_trl" in report:
        lines.append(f"speedup_vs_trl {report['speedup_vs_trl']:.2f} "
                     f"(per repetition {report['speedup_vs_trl_per_rep']}), "
                     f"rss_vs_trl {report['rss_vs_trl']:.2f}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
