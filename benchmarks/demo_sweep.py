"""The LLM demo's sweep (its runs: docs/results.md): one training run per cell, ``--jobs`` at a time.

Each cell is the demo's TrainConfig (``entrogym.experiments.demo_config``: SmolLM2-135M-Instruct,
one-digit arithmetic, the demo's tasks x samples per iteration, 48 response tokens) with its own
preset, knobs, learning rate, iteration count and seed. Every finished run appends one JSON line
to ``OUT/sweep.jsonl``: the settings, the per-iteration entropy, target, lever coefficient and
reward, ``tracking_error`` (mean |H / H_target - 1| over the second half), ``max_excursion``
(the largest |H / H_target - 1| from the 3rd iteration on), the held-out accuracy rows, the
wall time and the load average. Cells already in the file are skipped, so a sweep can be
stopped and continued without rerunning anything.

    nice -n 10 .venv/bin/python benchmarks/demo_sweep.py --out runs/demo-sweep \\
        --cell "grpo --lr 1e-3 --iters 15 --seed 0" \\
        --cell "repo-d --algo.controller pi --lr 1e-3 --iters 20 --seed 0"

A cell is a run of the demo written as a preset or labelled variant (the algorithm options of
``entrogym train``) followed by the cell's own settings: --lr, --iters, --seed, --engine,
--engine-dtype (the sampler's; the learner stays fp32), --eval-tasks, --threads.
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from entrogym.algos.levers import LEVERS
from entrogym.commands.demo_runs import parse_run, spec_label
from entrogym.experiments import demo_config, tracking, train_one

CELL_KEYS = ("lr", "iters", "seed", "engine", "engine_dtype", "eval_tasks", "threads")


def logged_coefficient(lever: str, row: dict[str, Any]) -> str | None:
    """The metrics key of ``lever``'s own coefficient (its registered ``Coefficient``'s name),
    or None where the lever has none or ``row`` (a metrics row) did not log it."""
    own = getattr(LEVERS.get(lever), "coefficient", None)
    return own.name if own is not None and row.get(own.name) is not None else None


def parse_cell(text: str) -> dict[str, Any]:
    """``"PRESET [--algo... options] [--lr X --iters N --seed S ...]"`` -> settings."""
    import shlex

    from entrogym.commands.algo_text import split_algo_args

    words = shlex.split(text)
    algo_words, rest = split_algo_args(words[1:])
    cell: dict[str, Any] = {"lr": 1e-3, "iters": 15, "seed": 0,
                            "engine": "hf", "engine_dtype": "fp32", "eval_tasks": 40,
                            "threads": None}  # fmt: skip
    while rest:
        option = rest.pop(0)
        key = option.lstrip("-").replace("-", "_")
        if not option.startswith("--") or key not in CELL_KEYS or not rest:
            raise ValueError(
                f"--cell {text!r}: {option!r} is not one of --{', --'.join(CELL_KEYS)} VALUE"
            )
        value = rest.pop(0)
        cell[key] = value if key in ("engine", "engine_dtype") else float(value)
    cell["algo"] = spec_label(shlex.join([words[0], *algo_words]))  # the run, as its label
    cell["iters"], cell["seed"] = int(cell["iters"]), int(cell["seed"])
    cell["eval_tasks"] = int(cell["eval_tasks"])
    cell["threads"] = None if cell["threads"] is None else int(cell["threads"])
    return cell


def _shown(value: float | str) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def cell_name(cell: dict[str, Any]) -> str:
    folder = parse_run(cell["algo"]).folder
    # a cell written before engine_dtype was a key sampled in fp32, and keeps its name
    dtype = cell.get("engine_dtype", "fp32")
    suffix = "" if dtype == "fp32" else f"_{dtype}"
    return f"{folder}_lr{cell['lr']:g}_it{cell['iters']}_s{cell['seed']}_{cell['engine']}{suffix}"


def run_cell(cell: dict[str, Any], out: Path) -> dict[str, Any]:
    """Train one cell through the demo's own runner (``train_one``); its per-iteration record,
    with the tracking, controller and timing columns the sweep's tables show."""
    from entrogym.train.evaluation.target_tracking import filled_targets
    from entrogym.train.folder.metrics import read_metrics

    name = cell_name(cell)
    cfg = demo_config(parse_run(cell["algo"]).algo, out / "runs", cell["iters"], cell["lr"], cell["eval_tasks"],
                      seed=cell["seed"], engine=cell["engine"], name=name,
                      threads=cell["threads"],
                      engine_dtype=cell.get("engine_dtype", "fp32"))  # fmt: skip
    run = train_one(cfg)
    rows = read_metrics(Path(run["folder"]))
    rows_t = [r for r in rows if r.get("kind", "train") == "train"]
    # the estimator the controller tracks (its target is in those terms); the sampled
    # surprisal beside it. Rows written before entropy_tracked was logged hold only the latter.
    entropy = [r.get("entropy_tracked") or r["entropy"] for r in rows_t]
    targets = [r["entropy_target"] for r in rows_t]
    target = filled_targets(targets, entropy)
    # the lever's own coefficient, as the registry names it (none for the plain presets)
    coefficient = logged_coefficient(cfg.algo.lever.name, rows_t[0])
    per_iteration = ("clip_frac_high", "zero_adv_groups", "response_tokens_mean", "iteration_s")
    return {
        "name": name,
        **cell,
        "wall_s": run["wall_s"],
        "load_avg_end": os.getloadavg()[0],
        "entropy": entropy,
        "entropy_sampled": [r["entropy"] for r in rows_t],
        "entropy_target": target,
        **tracking({"entropy": entropy, "entropy_target": targets}),
        "entropy_ratio": entropy[-1] / entropy[0],
        "reward": [r["reward_mean"] for r in rows_t],
        "coefficient": coefficient,
        "coefficients": [r.get(coefficient) for r in rows_t] if coefficient else [],
        **{key: [r.get(key) for r in rows_t] for key in per_iteration},
        "accuracy": {int(r["iteration"]): r["pass@1"] for r in rows if r.get("kind") == "eval"},
    }


def _run_in_worker(cell: dict[str, Any], out: str) -> dict[str, Any]:
    return run_cell(cell, Path(out))


def label_of(cell: dict[str, Any]) -> str:
    return cell["algo"].replace("--algo.", "")


def table(log: Path) -> str:
    """The sweep as a markdown table (docs/results.md), one row per finished run, in run order."""
    lines = ["| run | lr | iters | seed | entropy first -> last (min, max) | tracking error | "
             "max excursion (3rd iter on) | coefficient first -> last | reward first -> last | "
             "held-out accuracy after iter 1 -> last | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for line in log.open():
        r = json.loads(line)
        e, c, acc = r["entropy"], r.get("coefficients") or [], list(r["accuracy"].values())
        coef = f"{r['coefficient']} {c[0]:.3g} -> {c[-1]:.3g}" if c and c[0] is not None else "-"
        accuracy = f"{acc[0]:.3f} -> {acc[-1]:.3f}" if acc else "not measured"
        lines.append(
            f"| {label_of(r)} | {r['lr']:g} | {r['iters']} | {r['seed']} | {e[0]:.3f} -> "
            f"{e[-1]:.3f} ({min(e):.3f}, {max(e):.3f}) | {r['tracking_error']:.3f} | "
            f"{r['max_excursion']:.3f} | {coef} | {r['reward'][0]:.2f} -> {r['reward'][-1]:.2f} | "
            f"{accuracy} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def traces(log: Path) -> str:
    """Per-iteration entropy / target and the coefficient of every run (docs/results.md)."""
    out = []
    for line in log.open():
        r = json.loads(line)
        ratios = " ".join(
            f"{h / t:.2f}" for h, t in zip(r["entropy"], r["entropy_target"], strict=True)
        )
        out.append(f"{label_of(r)}, lr {r['lr']:g}, seed {r['seed']}: H/H* {ratios}")
        if r.get("coefficients") and r["coefficients"][0] is not None:
            coefs = " ".join(f"{c:.3g}" for c in r["coefficients"])
            out.append(f"    {r['coefficient']}: {coefs}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="sweep folder (sweep.jsonl, runs/)")
    parser.add_argument(
        "--cell",
        action="append",
        default=[],
        help='"PRESET [--algo... options] [--lr X --iters N --seed S ...]"',
    )
    parser.add_argument("--jobs", type=int, default=1, help="cells run side by side")
    parser.add_argument("--table", action="store_true", help="print OUT/sweep.jsonl as markdown")
    parser.add_argument("--traces", action="store_true", help="print per-iteration traces")
    args = parser.parse_args()
    out = Path(args.out)
    if args.table or args.traces:
        print(table(out / "sweep.jsonl") if args.table else traces(out / "sweep.jsonl"))
        return
    out.mkdir(parents=True, exist_ok=True)
    log = out / "sweep.jsonl"
    done = {json.loads(line)["name"] for line in log.open()} if log.exists() else set()
    cells = [c for c in map(parse_cell, args.cell) if cell_name(c) not in done]
    for name in {cell_name(c) for c in map(parse_cell, args.cell)} & done:
        print(f"skip {name} (in {log})", flush=True)
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn"),
                             max_tasks_per_child=1) as pool:  # fmt: skip
        futures = [pool.submit(_run_in_worker, cell, str(out)) for cell in cells]
        for future in as_completed(futures):
            record = future.result()
            with log.open("a") as f:
                f.write(json.dumps(record) + "\n")
            print(
                f"{record['name']}: entropy {record['entropy'][0]:.3f} -> "
                f"{record['entropy'][-1]:.3f}, tracking {record['tracking_error']:.3f}, max "
                f"excursion {record['max_excursion']:.3f}, reward {record['reward'][-1]:.2f}, "
                f"accuracy {record['accuracy']}, wall {record['wall_s']:.0f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
