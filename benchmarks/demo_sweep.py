"""The LLM demo's sweep (docs/demo.md): one training run per cell, one at a time.

Each cell is the demo's TrainConfig (``entrogym.demo.demo_config``: SmolLM2-135M-Instruct,
one-digit arithmetic, 6 tasks x 4 samples, 48 response tokens) with its own preset, knobs,
learning rate, iteration count and seed. Every finished run appends one JSON line to
``OUT/sweep.jsonl``: the settings, the per-iteration entropy, reward and zeta / eps_high, the
held-out accuracy rows, and the wall time. Cells already in the file are skipped, so a sweep
can be stopped and continued without rerunning anything.

    nice -n 10 .venv/bin/python benchmarks/demo_sweep.py --out runs/demo-sweep \\
        --cell "grpo --lr 1e-3 --iters 15 --seed 0" \\
        --cell "repo-d --algo.controller pi --lr 1e-3 --iters 20 --seed 0"

A cell is a run of the demo written as a preset or labelled variant (the algorithm options of
``entrogym train``) followed by the cell's own settings: --lr, --iters, --seed, --engine,
--eval-tasks, --threads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

CELL_KEYS = ("lr", "iters", "seed", "engine", "eval_tasks", "threads")


def parse_cell(text: str) -> dict[str, Any]:
    """``"PRESET [--algo... options] [--lr X --iters N --seed S ...]"`` -> settings."""
    import shlex

    from entrogym.train.algo_spec import parse_label, split_algo_args, typed_spec

    words = shlex.split(text)
    algo_words, rest = split_algo_args(words[1:])
    cell: dict[str, Any] = {"lr": 1e-3, "iters": 15, "seed": 0,
                            "engine": "hf", "eval_tasks": 40, "threads": None}  # fmt: skip
    while rest:
        option = rest.pop(0)
        key = option.lstrip("-").replace("-", "_")
        if not option.startswith("--") or key not in CELL_KEYS or not rest:
            raise ValueError(
                f"--cell {text!r}: {option!r} is not one of --{', --'.join(CELL_KEYS)} VALUE"
            )
        value = rest.pop(0)
        cell[key] = value if key == "engine" else float(value)
    cell["algo"] = typed_spec(parse_label(shlex.join([words[0], *algo_words])))
    cell["iters"], cell["seed"] = int(cell["iters"]), int(cell["seed"])
    cell["eval_tasks"] = int(cell["eval_tasks"])
    cell["threads"] = None if cell["threads"] is None else int(cell["threads"])
    return cell


def _shown(value: float | str) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def cell_name(cell: dict[str, Any]) -> str:
    from entrogym.demo.config import parse_run
    from entrogym.train.algo_spec import label

    folder = parse_run(label(cell["algo"]))[1]
    return f"{folder}_lr{cell['lr']:g}_it{cell['iters']}_s{cell['seed']}_{cell['engine']}"


def run_cell(cell: dict[str, Any], out: Path) -> dict[str, Any]:
    """Train one cell through the demo's own runner (``train_one``); its per-iteration record,
    with the controller and timing columns the sweep's tables also show."""
    from entrogym.demo import demo_config, train_one
    from entrogym.train.metrics import read_metrics

    name = cell_name(cell)
    # eval_tasks=0: no held-out eval, the sweep's budget goes to iterations
    cfg = demo_config(cell["algo"], out / "runs", cell["iters"], cell["lr"], cell["eval_tasks"],
                      seed=cell["seed"], engine=cell["engine"], name=name,
                      threads=cell["threads"])  # fmt: skip
    run = train_one(cfg)
    rows = read_metrics(Path(run["folder"]))
    rows_t = [r for r in rows if r.get("kind", "train") == "train"]
    per_iteration = ("eps_high", "clip_frac_high", "rollout_s", "update_s", "tokens_per_s")
    return {
        "name": name,
        **cell,
        **{k: run[k] for k in ("wall_s", "entropy", "entropy_ratio", "reward", "zeta")},
        "entropy_min_ratio": min(run["entropy"]) / run["entropy"][0],
        **{key: [r.get(key) for r in rows_t] for key in per_iteration},
        "accuracy": {int(r["iteration"]): r["pass@1"] for r in rows if r.get("kind") == "eval"},
    }


def table(log: Path) -> str:
    """The sweep as a markdown table (docs/demo.md), one row per finished run."""
    lines = ["| run | lr | iters | seed | entropy first -> last (min) | ratio | zeta first -> last "
             "| reward first -> last | accuracy after iter 1 -> last | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for line in log.open():
        r = json.loads(line)
        knobs = ", ".join(f"{k}={_shown(v)}" for k, v in r["algo"].items() if k != "name")
        label = r["algo"]["name"] + (f" ({knobs})" if knobs else "")
        e, z, acc = r["entropy"], r["zeta"], list(r["accuracy"].values())
        zeta = f"{z[0]:.3g} -> {z[-1]:.3g}" if z[0] is not None else "-"
        accuracy = f"{acc[0]:.3f} -> {acc[-1]:.3f}" if acc else "not measured"
        lines.append(
            f"| {label} | {r['lr']:g} | {r['iters']} | {r['seed']} | {e[0]:.3f} -> {e[-1]:.3f} "
            f"({min(e):.3f}) | {r['entropy_ratio']:.2f} | {zeta} | {r['reward'][0]:.2f} -> "
            f"{r['reward'][-1]:.2f} | {accuracy} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="sweep folder (sweep.jsonl, runs/)")
    parser.add_argument("--cell", action="append", default=[], help="preset:key=value:...")
    parser.add_argument("--table", action="store_true", help="print OUT/sweep.jsonl as markdown")
    args = parser.parse_args()
    out = Path(args.out)
    if args.table:
        print(table(out / "sweep.jsonl"))
        return
    out.mkdir(parents=True, exist_ok=True)
    log = out / "sweep.jsonl"
    done = {json.loads(line)["name"] for line in log.open()} if log.exists() else set()
    for cell in map(parse_cell, args.cell):
        if cell_name(cell) in done:
            print(f"skip {cell_name(cell)} (in {log})", flush=True)
            continue
        record = run_cell(cell, out)
        with log.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(
            f"{record['name']}: entropy {record['entropy'][0]:.3f} -> {record['entropy'][-1]:.3f}"
            f" (ratio {record['entropy_ratio']:.2f}), reward {record['reward'][-1]:.2f},"
            f" accuracy {record['accuracy']}, wall {record['wall_s']:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
