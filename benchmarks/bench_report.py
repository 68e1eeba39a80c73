"""The report of ``benchmarks/iteration.py``: medians over repetitions, each repetition with
the load average it ran at, flags on outliers, the speed-ups against TRL per iteration and per
token, and the markdown table. Pure functions of the workers' results (tested on made-up ones).
"""

from __future__ import annotations

import statistics
from typing import Any

from roofline import roofline_fraction

# A repetition slower than this many times the median of its siblings is flagged.
OUTLIER = 2.0
# Generated tokens of entrogym and TRL within this share count as equal work.
EQUAL_WORK = 0.02


def timed_index(iterations: int) -> int:
    """Iteration 1 when there are 3 or more (warm; for an async run the first that overlaps
    on both sides), else the last."""
    return 1 if iterations >= 3 else iterations - 1


def flag_outliers(seconds: list[float]) -> list[bool]:
    """True for a repetition more than :data:`OUTLIER` x the median of the others."""
    flags = []
    for i, x in enumerate(seconds):
        others = seconds[:i] + seconds[i + 1 :]
        flags.append(bool(others) and x > OUTLIER * statistics.median(others))
    return flags


def summarize(runs: list[dict], dtype: str, body_key: str = "bf16") -> dict:
    """Medians over repetitions of the timed iteration, and every repetition."""
    timed = [r["iterations"][timed_index(len(r["iterations"]))] for r in runs]
    seconds = [x["seconds"] for x in timed]
    med = lambda key: statistics.median(x[key] for x in timed)  # noqa: E731
    out: dict[str, Any] = {
        "seconds_per_iteration": [round(x, 3) for x in seconds],
        "median_seconds_per_iteration": statistics.median(seconds),
        "repetitions": [
            {"seconds": round(x, 3), "load_1min": round(r["load_1min"], 2), "flagged": f}
            for x, r, f in zip(seconds, runs, flag_outliers(seconds), strict=True)
        ],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "startup_s": statistics.median(r["startup_s"] for r in runs),
        "threads": runs[0]["threads"],
        "ceiling_gflops": runs[-1]["ceiling_gflops"],
    }
    if "generated_tokens" in timed[0]:
        out["generated_tokens_per_iteration"] = med("generated_tokens")
        out["learner_tokens_per_iteration"] = med("learner_tokens")
    if "phases_s" in timed[0]:
        out["phases_s"] = {
            k: round(statistics.median(x["phases_s"].get(k, 0.0) for x in timed), 3)
            for k in timed[0]["phases_s"]
        }
        for key in ("generated_tokens_per_s", "learner_tokens_per_s", "learner_gflops_per_s"):
            out[key] = round(med(key), 2)
        ceiling = statistics.median(
            r["ceiling_gflops"]["fp32" if dtype == "fp32" else body_key] for r in runs
        )
        out["learner_ceiling_fraction"] = out["learner_gflops_per_s"] / ceiling
        out["sampler_mismatch"] = [x["sampler_mismatch"] for x in timed]
    if timed[0].get("learner_all_cores_s") is not None:
        out["learner_all_cores_s"] = [x["learner_all_cores_s"] for x in timed]
    return out


def _per_token(trl: dict, mine: dict, key: str) -> float:
    """TRL's seconds per token over entrogym's (tokens of the timed iterations' medians)."""
    theirs = trl["median_seconds_per_iteration"] / trl[key]
    ours = mine["median_seconds_per_iteration"] / mine[key]
    return round(theirs / ours, 3)


def generation_roofline(tokens_per_s: float, rates: dict) -> dict:
    """``generation_roofline_fraction`` of a generation rate, and the bound's inputs (the
    ``bench_generation.py`` result that measured them) beside it."""
    bound = rates["roofline"]
    return {
        "generation_roofline_fraction": roofline_fraction(tokens_per_s, bound),
        "generation_roofline": {"engine_dtype": rates["dtype"], **bound},
    }


def roofline_row(row: dict) -> dict:
    """A roofline row: generation alone, its repetitions and its fraction; or why it was
    skipped."""
    keep = {k: row[k] for k in ("engine", "dtype", "skipped") if k in row}
    if "skipped" in keep:
        return keep
    return keep | {
        "tokens_per_s": row["tokens_per_s"],
        "startup_s": row["startup_s"],
        "repetitions": row["repetitions"],
        "generation_roofline_fraction": roofline_fraction(row["tokens_per_s"], row["roofline"]),
        "roofline": row["roofline"],
    }


def build_report(
    runs: dict[str, list[dict]], args: Any, settings: dict, generation: dict | None = None
) -> dict:
    """The JSON document: ``entrogym`` (sync), ``entrogym_async``, ``trl`` and the ratios:
    ``speedup_vs_trl`` (TRL's median seconds per iteration over the synchronous loop's),
    ``speedup_vs_trl_async``, the same per generated and per learner token
    (``..._per_generated_token``, ``..._per_learner_token``; the unsuffixed ones are the
    synchronous loop's), ``async_vs_sync`` and ``equal_work``. With ``generation``
    (``iteration.measure_generation``): ``entrogym.generation_roofline_fraction`` and
    ``generation_rows``."""
    sync = summarize(runs["entrogym"], args.dtype)
    if generation is not None:
        sync |= generation_roofline(sync["generated_tokens_per_s"], generation["rates"])
    report: dict[str, Any] = {
        "learner_ceiling_fraction": round(sync["learner_ceiling_fraction"], 3),
        "peak_rss_mb": round(sync["peak_rss_mb"]),
        "startup_s": round(sync["startup_s"], 2),
        "config": dict(vars(args)) | {"settings": settings},
        "entrogym": sync,
    }
    if generation is not None:
        report["generation_rows"] = [roofline_row(r) for r in generation["rows"]]
    if "entrogym_async" in runs:
        asynchronous = summarize(runs["entrogym_async"], args.dtype)
        report["entrogym_async"] = asynchronous
        report["async_vs_sync"] = round(
            sync["median_seconds_per_iteration"] / asynchronous["median_seconds_per_iteration"], 3
        )
        report["learner_ceiling_fraction_async"] = round(
            asynchronous["learner_ceiling_fraction"], 3
        )
    if "trl" in runs:
        trl = summarize(runs["trl"], "fp32")
        report["trl"] = trl
        for suffix, mine in (("", sync), ("_async", report.get("entrogym_async"))):
            if mine is None:
                continue
            name = f"speedup_vs_trl{suffix}"
            report[name] = round(
                trl["median_seconds_per_iteration"] / mine["median_seconds_per_iteration"], 3
            )
            report[f"{name}_per_generated_token"] = _per_token(
                trl, mine, "generated_tokens_per_iteration"
            )
            report[f"{name}_per_learner_token"] = _per_token(
                trl, mine, "learner_tokens_per_iteration"
            )
        ratio = sync["generated_tokens_per_iteration"] / trl["generated_tokens_per_iteration"]
        report["equal_work"] = {
            "generated_tokens_ratio": round(ratio, 4),
            "within_2_percent": abs(ratio - 1) <= EQUAL_WORK,
        }
        report["rss_vs_trl"] = round(sync["peak_rss_mb"] / trl["peak_rss_mb"], 3)
        if "entrogym_async" in report:
            report["rss_vs_trl_async"] = round(
                report["entrogym_async"]["peak_rss_mb"] / trl["peak_rss_mb"], 3
            )
    return report


def table(report: dict) -> str:
    """The report as markdown: one row per framework (every repetition with its load average,
    ``!`` on a flagged one), the phases, then the ratios."""
    rows = [("entrogym sync", report["entrogym"])]
    rows += [("entrogym async", report["entrogym_async"])] if "entrogym_async" in report else []
    rows += [("TRL", report["trl"])] if "trl" in report else []
    lines = ["| framework | s / iter (median) | repetitions: s (load) | generated tok / iter | "
             "learner tok / iter | peak RSS MB | start-up s |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in rows:
        reps = ", ".join(
            f"{x['seconds']:.1f} ({x['load_1min']:.1f}){'!' if x['flagged'] else ''}"
            for x in r["repetitions"]
        )
        gen = r.get("generated_tokens_per_iteration", "-")
        learn = r.get("learner_tokens_per_iteration", "-")
        lines.append(f"| {name} | {r['median_seconds_per_iteration']:.1f} | {reps} | {gen} | "
                     f"{learn} | {r['peak_rss_mb']:.0f} | {r['startup_s']:.1f} |")  # fmt: skip
    for name, r in rows:
        if "phases_s" in r:
            phases = ", ".join(f"{k} {v:.2f}" for k, v in r["phases_s"].items())
            lines.append(f"\n{name} phases (s): {phases}")
            lines.append(f"{name} learner: {r['learner_ceiling_fraction']:.2f} of the ceiling "
                         f"({r['learner_gflops_per_s']:.0f} GFLOP/s; ceilings "
                         f"{ {k: round(v) for k, v in r['ceiling_gflops'].items()} })")  # fmt: skip
    if any(x["flagged"] for _, r in rows for x in r["repetitions"]):
        lines.append(f"! = more than {OUTLIER:g}x the median of its siblings (a loaded machine?)")
    lines += roofline_lines(report)
    ratios = [k for k in report if k.startswith(("speedup", "async_vs", "rss_vs"))]
    if ratios:
        lines.append("\n" + ", ".join(f"{k} {report[k]}" for k in ratios))
    if "equal_work" in report:
        lines.append(f"equal work: {report['equal_work']}")
    return "\n".join(lines)


def roofline_lines(report: dict) -> list[str]:
    """The roofline line of the synchronous run's generation, then a table of the rows."""
    if "generation_roofline" not in report["entrogym"]:
        return []
    sync, bound = report["entrogym"], report["entrogym"]["generation_roofline"]
    lines = [f"\nroofline: entrogym sync generation ({bound['engine_dtype']} sampler) "
             f"{sync['generated_tokens_per_s']:.0f} tok/s = "
             f"{sync['generation_roofline_fraction']:.3f} of {_bound_text(bound)}"]  # fmt: skip
    rows = report.get("generation_rows", [])
    if rows:
        lines += ["\n| engine | sampler dtype | tok/s (median) | repetitions: tok/s (load) | "
                  "start-up s | roofline fraction | bound |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['engine']} | {r['dtype']} | skipped: {r['skipped']} | | | | |")
            continue
        reps = ", ".join(
            f"{x['tokens_per_s']:.0f} ({x['load_1min']:.1f})" for x in r["repetitions"]
        )
        lines.append(f"| {r['engine']} | {r['dtype']} | {r['tokens_per_s']:.0f} | {reps} | "
                     f"{r['startup_s']:.1f} | {r['generation_roofline_fraction']:.3f} | "
                     f"{_bound_text(r['roofline'])} |")  # fmt: skip
    return lines


def _bound_text(bound: dict) -> str:
    return (f"min(flop {bound['flop_bound_tokens_per_s']:.0f}, byte "
            f"{bound['byte_bound_tokens_per_s']:.0f}) tok/s ({bound['matmul_gflops']:.0f} GFLOP/s, "
            f"{bound['read_gb_s']:.0f} GB/s, {bound['batch']} rows, context "
            f"{bound['context']:.0f})")  # fmt: skip
