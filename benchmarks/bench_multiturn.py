"""The multi-turn row of ``make bench``: GRPO iterations on a conversation with one tool, entrogym's
synchronous and asynchronous loops against TRL's ``GRPOTrainer(environment_factory=...)``.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/bench_multiturn.py --reps 3
    make bench      # iteration.py --multiturn: the same, under "multiturn" in its JSON

The workload: ``--tasks`` x ``--samples`` conversations of ``multiturn_env.TalkTools`` (one
tool, ``say``, whose every call takes ``--latency-ms``, standing in for an env server such as
AppWorld's), one class on both sides: TRL trains it through ``environment_factory``, entrogym
through its TRL-style wrapper. Equal work: every turn is exactly ``--turn-tokens`` tokens on
both sides (EOS ignored), and every turn but the last is read as one call to ``say`` whatever
the model wrote (multiturn_env.py), so every episode runs the cell's number of turns. The
model is ``--model`` with a chat template that renders tools (TRL's Qwen2.5 ChatML template,
from ``.venv-bench``: SmolLM2's own has no tools, and both sides then render the same text).

Cells, each run in fresh processes for ``--iterations`` iterations (iteration 1 timed: warm,
and for the async loop collected beside the update before it), in a rotating order per
repetition:
- entrogym sync, entrogym async (``--max-staleness 1``) and TRL at ``--turns`` turns and each
  ``--latency-ms``: ``speedup_vs_trl`` and ``async_vs_sync`` per latency;
- entrogym sync (and TRL, with ``--sweep-trl``) at each ``--sweep-turns`` with no latency: the
  cost per turn as turns grow, and ``turn_cost_ratio`` (entrogym's generation tokens/s, over
  the seconds of its generation phase, at the most turns over at 1 turn).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench_common import DEMO, HERE, ROOT, Workload, run_worker
from bench_report import EQUAL_WORK, summarize, timed_index

BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
FRAMEWORKS = ("entrogym", "entrogym_async", "trl")
# TRL's ChatML template with tools; add_response_schema knows it, so TRL parses its calls.
TOOL_TEMPLATE = "trl/chat_templates/qwen2_5.jinja"


def add_arguments(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """The workload's options (``prefix``: ``multiturn-`` inside ``iteration.py``)."""
    p.add_argument(f"--{prefix}turns", type=int, default=4, help="turns of the TRL/async cells")
    p.add_argument(f"--{prefix}latency-ms", nargs="+", type=float, default=[0.0, 100.0])
    p.add_argument(f"--{prefix}sweep-turns", nargs="*", type=int, default=[1, 2, 4, 8])
    p.add_argument(f"--{prefix}tasks", type=int, default=2)
    p.add_argument(f"--{prefix}samples", type=int, default=4)
    p.add_argument(f"--{prefix}turn-tokens", type=int, default=24)
    p.add_argument(f"--{prefix}context", type=int, default=1024)
    p.add_argument(f"--{prefix}iterations", type=int, default=2, help="per process; the last timed")
    p.add_argument(f"--{prefix}sweep-trl", action="store_true", help="TRL in the turn sweep too")
    p.add_argument(f"--{prefix}frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    p.add_argument(
        f"--{prefix}old-logprobs",
        choices=("learner", "sampler"),
        default="learner",
        help="entrogym's TrainConfig.old_logprobs (sampler: the hf engine's fp32 log-probs, no "
        "scoring pass)",
    )


def options(args: argparse.Namespace, prefix: str = "") -> argparse.Namespace:
    """The workload's options without their prefix, with the shared ones (model, reps, ...)."""
    key = prefix.replace("-", "_")
    names = ("turns", "latency_ms", "sweep_turns", "tasks", "samples", "turn_tokens", "context",
             "iterations", "sweep_trl", "frameworks", "old_logprobs")  # fmt: skip
    out = {name: getattr(args, key + name) for name in names}
    for shared in ("model", "reps", "threads", "seed", "timeout"):
        out[shared] = getattr(args, shared)
    return argparse.Namespace(**out)


def check(opts: argparse.Namespace) -> None:
    """One-line refusals, before any model loads."""
    turns = [opts.turns, *opts.sweep_turns]
    if min(turns) < 1 or opts.turn_tokens < 1 or opts.iterations < 1:
        raise SystemExit("multi-turn: turns, turn tokens and iterations must be >= 1")
    if any(x < 0 for x in opts.latency_ms):
        raise SystemExit("multi-turn: --latency-ms must be >= 0")
    if (opts.tasks * opts.samples) % 2:
        raise SystemExit("multi-turn: tasks x samples must be even (two minibatches)")
    if tool_template() is None:
        raise SystemExit(
            f"multi-turn: TRL's tool template ({TOOL_TEMPLATE}) is not in .venv-bench; build "
            "it with: make bench"
        )


def tool_template() -> Path | None:
    found = sorted((ROOT / ".venv-bench" / "lib").glob(f"python*/site-packages/{TOOL_TEMPLATE}"))
    return found[0] if found else None


def tool_model(model_dir: str, dest: Path) -> str:
    """``model_dir`` with TRL's tool-rendering ChatML template: its files linked, the chat
    template replaced (SmolLM2's tokens are ChatML's)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in Path(model_dir).iterdir():
        if f.name != "chat_template.jinja":
            (dest / f.name).symlink_to(f.resolve())
    (dest / "chat_template.jinja").write_text(tool_template().read_text())
    return str(dest)


def workload(opts: argparse.Namespace, model_dir: str, turns: int, latency: float) -> Workload:
    """One cell's work: the conversations' first messages (equal in length), DEMO's update."""
    minibatch = opts.tasks * opts.samples // 2  # two optimizer steps, as DEMO's
    # micro-batches that divide the minibatch: TRL's generation batch is a whole number of them
    micro = max(m for m in range(1, DEMO["micro_batch_size"] + 1) if minibatch % m == 0)
    settings = dict(DEMO, tasks=opts.tasks, samples=opts.samples, ignore_eos=True,
                    max_response_tokens=opts.turn_tokens, max_context_tokens=opts.context,
                    minibatch_size=minibatch, micro_batch_size=micro)  # fmt: skip
    prompts = [
        [{"role": "user", "content": f"Conversation {i:03d}: tell me about the number {i:03d}."}]
        for i in range(opts.tasks * opts.iterations)
    ]
    return Workload(
        model_dir=model_dir, prompts=prompts, answers=[""] * len(prompts),
        iterations=opts.iterations, threads=opts.threads, seed=opts.seed, settings=settings,
        multiturn={"turns": turns, "latency_ms": latency},
    )  # fmt: skip


def cells(opts: argparse.Namespace) -> list[tuple[str, int, float]]:
    """(framework, turns, latency ms) of every cell, without repeats."""
    out = [(f, opts.turns, lat) for lat in opts.latency_ms for f in FRAMEWORKS]
    swept = ("entrogym", "trl") if opts.sweep_trl else ("entrogym",)
    out += [(f, t, 0.0) for t in opts.sweep_turns for f in swept]
    return [cell for cell in dict.fromkeys(out) if cell[0] in opts.frameworks]


def command(framework: str, work_file: Path, result: Path, old_logprobs: str) -> list[str]:
    if framework == "trl":
        return [str(BENCH_PYTHON), str(HERE / "bench_trl.py"), str(work_file), str(result)]
    staleness = "1" if framework == "entrogym_async" else "0"
    return [sys.executable, str(HERE / "bench_entrogym.py"), str(work_file), str(result),
            "--max-staleness", staleness, "--old-logprobs", old_logprobs]  # fmt: skip


def measure(opts: argparse.Namespace) -> dict:
    """Every cell ``opts.reps`` times, interleaved; the report (:func:`report`)."""
    from entrogym.models import resolve_model

    runs: dict[tuple[str, int, float], list[dict]] = {}
    todo = cells(opts)
    with tempfile.TemporaryDirectory(prefix="multiturn-bench-") as tmp:
        model_dir = tool_model(str(resolve_model(opts.model)), Path(tmp) / "model")
        result = Path(tmp) / "result.json"
        for rep in range(opts.reps):
            shift = rep % len(todo)
            for cell in todo[shift:] + todo[:shift]:
                framework, turns, latency = cell
                work_file = Path(tmp) / f"work-{turns}-{latency:g}.json"
                workload(opts, model_dir, turns, latency).save(work_file)
                load = os.getloadavg()[0]
                out = run_worker(
                    command(framework, work_file, result, opts.old_logprobs), result, opts.timeout
                )
                out["load_1min"] = load
                runs.setdefault(cell, []).append(out)
                timed = out["iterations"][timed_index(len(out["iterations"]))]
                print(f"multi-turn rep {rep + 1}/{opts.reps} {framework} {turns} turns "
                      f"{latency:g} ms: {timed['seconds']:.2f} s, load {load:.2f}",
                      file=sys.stderr, flush=True)  # fmt: skip
    return report(runs, opts)


def report(runs: dict[tuple[str, int, float], list[dict]], opts: argparse.Namespace) -> dict:
    """The cells' medians (``bench_report.summarize``) and the ratios: ``speedup_vs_trl`` and
    ``async_vs_sync`` per latency (``"0ms"``, ``"100ms"``) at ``opts.turns`` turns,
    ``turn_cost_ratio`` (entrogym's generation tokens/s at the most swept turns over at 1
    turn; TRL's beside it as ``trl_turn_cost_ratio``), and ``equal_work`` per cell pair."""
    rows = []
    summaries: dict[tuple[str, int, float], dict] = {}
    for (framework, turns, latency), cell_runs in runs.items():
        s = summarize(cell_runs, "fp32")
        summaries[(framework, turns, latency)] = s
        rows.append({"framework": framework, "turns": turns, "latency_ms": latency} | s)
    seconds = {k: v["median_seconds_per_iteration"] for k, v in summaries.items()}
    out: dict = {"cells": rows, "speedup_vs_trl": {}, "async_vs_sync": {}, "equal_work": {}}
    for latency in opts.latency_ms:
        key, sync = f"{latency:g}ms", ("entrogym", opts.turns, latency)
        if sync in seconds and ("trl", opts.turns, latency) in seconds:
            out["speedup_vs_trl"][key] = round(
                seconds[("trl", opts.turns, latency)] / seconds[sync], 3
            )
        if sync in seconds and ("entrogym_async", opts.turns, latency) in seconds:
            out["async_vs_sync"][key] = round(
                seconds[sync] / seconds[("entrogym_async", opts.turns, latency)], 3
            )
    for (framework, turns, latency), s in summaries.items():
        theirs = summaries.get(("trl", turns, latency))
        if framework == "entrogym" and theirs is not None:
            ratio = s["generated_tokens_per_iteration"] / theirs["generated_tokens_per_iteration"]
            out["equal_work"][f"{turns} turns {latency:g}ms"] = {
                "generated_tokens_ratio": round(ratio, 4),
                "learner_tokens_ratio": round(
                    s["learner_tokens_per_iteration"] / theirs["learner_tokens_per_iteration"], 4
                ),
                "within_2_percent": abs(ratio - 1) <= EQUAL_WORK,
            }
    swept = sorted(opts.sweep_turns)
    if len(swept) > 1 and swept[0] == 1:
        ours = {t: summaries[("entrogym", t, 0.0)]["generated_tokens_per_s"] for t in swept}
        out["turn_cost_ratio"] = round(ours[swept[-1]] / ours[1], 3)
        out["generation_tokens_per_s_by_turns"] = {str(t): round(v, 1) for t, v in ours.items()}
        if opts.sweep_trl:
            trl = {t: tokens_per_s(summaries[("trl", t, 0.0)]) for t in swept}
            out["trl_turn_cost_ratio"] = round(trl[swept[-1]] / trl[1], 3)
            out["trl_tokens_per_s_by_turns"] = {str(t): round(v, 1) for t, v in trl.items()}
    out["config"] = dict(vars(opts))
    return out


def tokens_per_s(s: dict) -> float:
    """TRL reports no phases: its generated tokens over the whole iteration."""
    return s["generated_tokens_per_iteration"] / s["median_seconds_per_iteration"]


def table(multiturn: dict) -> str:
    """The multi-turn cells as markdown, then the ratios."""
    lines = ["| framework | turns | env latency | s / iter (median) | repetitions: s (load) | "
             "generated tok / iter | generation tok/s |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in sorted(
        multiturn["cells"], key=lambda r: (r["latency_ms"], r["turns"], r["framework"])
    ):
        reps = ", ".join(f"{x['seconds']:.1f} ({x['load_1min']:.1f})" for x in r["repetitions"])
        rate = r.get("generated_tokens_per_s", "-")
        lines.append(f"| {r['framework']} | {r['turns']} | {r['latency_ms']:g} ms | "
                     f"{r['median_seconds_per_iteration']:.1f} | {reps} | "
                     f"{r['generated_tokens_per_iteration']} | {rate} |")  # fmt: skip
    for key in ("speedup_vs_trl", "async_vs_sync", "turn_cost_ratio", "trl_turn_cost_ratio",
                "equal_work"):  # fmt: skip
        if key in multiturn:
            lines.append(f"{key}: {multiturn[key]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker process")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    add_arguments(p)
    args = p.parse_args(argv)
    opts = options(args)
    check(opts)
    multiturn = measure(opts)
    from host_features import host_features

    document = {"multiturn": multiturn, "host": host_features()}
    text = json.dumps(document, indent=1)
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    print(table(multiturn), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
