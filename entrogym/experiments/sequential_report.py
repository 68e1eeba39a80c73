"""What the sequential experiment shows: its goals per seed, a table of at most 100 columns, and
two plots (stage-1 entropy with the held run's band; stage-2 reward curves)."""

from __future__ import annotations

import json
import time
from importlib import resources
from pathlib import Path
from typing import Any

from entrogym.experiments.config import BAND

# The goals: the held start's stage-2 accuracy on B beats GRPO's start by this much as a
# mean over seeds (and on every seed), and its pass@16 on A by PASS_MARGIN on every seed.
STAGE2_MARGIN, PASS_MARGIN = 0.10, 0.05


def goals(summary: dict[str, Any]) -> dict[str, Any]:
    """The held run against GRPO, per seed: stage-2 accuracy on B, pass@16 on A, and the
    largest excursion of its entropy from its target (from the 3rd iteration on)."""
    held = summary["held"]
    by = {(r["label"], r["seed"]): r for r in summary["runs"]}
    seeds = sorted({r["seed"] for r in summary["runs"]})
    checks = []
    for seed in seeds:
        h, g = by.get((held, seed)), by.get(("grpo", seed))
        if h is None or g is None:
            continue
        ph, pg = h["stage1"]["pass_at_k"].get("16"), g["stage1"]["pass_at_k"].get("16")
        checks.append({
            "seed": seed,
            "stage2_gain": _diff(h["stage2"]["accuracy"], g["stage2"]["accuracy"]),
            "pass16_gain": _diff(ph, pg),
            "max_excursion": h["stage1"]["max_excursion"],
            # not a goal: the same comparison by stage 2's second-half mean (late_accuracy)
            "stage2_late_gain": _diff(h["stage2"].get("accuracy_late"),
                                      g["stage2"].get("accuracy_late")),
        })  # fmt: skip
    measured16 = all("16" in by[(label, c["seed"])]["stage1"]["pass_at_k"]
                     for c in checks for label in (held, "grpo"))  # fmt: skip
    gains = [c["stage2_gain"] for c in checks if c["stage2_gain"] is not None]
    mean_gain = sum(gains) / len(gains) if gains else None
    late = [c["stage2_late_gain"] for c in checks if c["stage2_late_gain"] is not None]
    return {
        "checks": checks,
        "stage2": bool(gains) and len(gains) == len(checks) and mean_gain >= STAGE2_MARGIN
        and all(g > 0 for g in gains),
        "stage2_mean_gain": mean_gain,
        "stage2_late_mean_gain": sum(late) / len(late) if late else None,
        # None: pass@16 was not measured (fewer than 16 samples per task), so neither met nor not
        "pass16": None if not checks or not measured16 else all(
            c["pass16_gain"] is not None and c["pass16_gain"] >= PASS_MARGIN for c in checks
        ),
        "tracking": bool(checks) and all(c["max_excursion"] <= BAND for c in checks),
    }  # fmt: skip


def _verdict(met: bool | None, samples: int | None) -> str:
    """``met``, ``NOT met``, or for a pass@k never measured, ``not measured`` and why."""
    if met is None:
        fewer = f": --pass-samples {samples} < 16" if samples is not None and samples < 16 else ""
        return f"not measured{fewer}"
    return "met" if met else "NOT met"


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _f(value: float | None, digits: int = 2) -> str:
    return "  -" if value is None else f"{value:.{digits}f}"


def report(summary: dict[str, Any]) -> str:
    """The printed outcome: per run and seed, stage 1 on A and stage 2 on B, then the goals."""
    pair = summary["pair"]
    ks = sorted({int(k) for r in summary["runs"] for k in r["stage1"]["pass_at_k"] if k.isdigit()})
    lines = [
        f"sequential: {pair['name']} ({pair['why']})",
        "A then B; stage 2 trains every stage-1 adapter with one algorithm",
        "",
        f"{'run':<10} {'seed':>4}  {'H first->last':>13} {'exc':>5}  "
        + " ".join(f"{'p@' + str(k):>5}" for k in ks)
        + f"  {'B acc 1st->last':>15} {'B area':>6}",
    ]
    base = summary["base"]["pass_at_k"] or {}
    lines.append(f"{'base':<10} {'':>4}  {'':>13} {'':>5}  "
                 + " ".join(f"{_f(base.get(str(k))):>5}" for k in ks))  # fmt: skip
    for run in summary["runs"]:
        one, two = run["stage1"], run["stage2"]
        entropy = f"{one['entropy'][0]:.2f}->{one['entropy'][-1]:.2f}"
        b_acc = f"{_f(two['accuracy_first'])}->{_f(two['accuracy'])}"
        lines.append(
            f"{run['label'][:10]:<10} {run['seed']:>4}  {entropy:>13} "
            f"{_f(one['max_excursion']):>5}  "
            + " ".join(f"{_f(one['pass_at_k'].get(str(k))):>5}" for k in ks)
            + f"  {b_acc:>15} {_f(two['area']):>6}"
        )
    result = goals(summary)
    held = summary["held"]
    samples = summary.get("settings", {}).get("pass_samples")
    mean = result["stage2_mean_gain"]
    seeds = len(result["checks"])
    lines += [
        "",
        f"goals ({held} against grpo, on each of {seeds} seed(s); the experiment asks for 3):",
        f"  stage 2: accuracy on B >= grpo's + {STAGE2_MARGIN:.2f} (mean), higher on every seed: "
        f"{'met' if result['stage2'] else 'NOT met'} (mean gain {_f(mean)})",
        f"  pass@16 on A >= grpo's + {PASS_MARGIN:.2f}: {_verdict(result['pass16'], samples)}",
        f"  entropy within +-{BAND:.0%} of its target from the 3rd iteration on: "
        f"{'met' if result['tracking'] else 'NOT met'}",
    ]
    if summary.get("settings", {}).get("stage2_eval_every"):
        late = " ".join(_f(c["stage2_late_gain"]) for c in result["checks"])
        lines.append(f"  (not a goal) B accuracy over stage 2's second half, {held} - grpo: "
                     f"{late} (mean {_f(result['stage2_late_mean_gain'])})")  # fmt: skip
    lines.append(f"wall time {summary['wall_s']:.0f} s")
    return "\n".join(lines)


def headline(summary: dict[str, Any]) -> str:
    """One line: the held start's and GRPO's start's held-out accuracy on B after stage 2, per
    seed, and the mean gain (``held start 0.33 / 0.40, grpo start 0.10 / 0.20 (seeds 0 / 1)``);
    over more than three seeds, their means and on how many seeds the held start was higher."""
    held = summary["held"]
    by = {(r["label"], r["seed"]): r["stage2"]["accuracy"] for r in summary["runs"]}
    seeds = [s for s in sorted({r["seed"] for r in summary["runs"]})
             if (held, s) in by and ("grpo", s) in by]  # fmt: skip
    mean = goals(summary)["stage2_mean_gain"]
    head = f"{summary['pair']['name']}, accuracy on B after stage 2: "
    if len(seeds) > 3:
        higher = sum(by[(held, s)] > by[("grpo", s)] for s in seeds)
        return (
            f"{head}{held} start {_f(_mean([by[(held, s)] for s in seeds]))}, grpo start "
            f"{_f(_mean([by[('grpo', s)] for s in seeds]))} (means over seeds {seeds[0]}-"
            f"{seeds[-1]}); {held} higher on {higher} of {len(seeds)}; mean gain {_f(mean)}"
        )
    return (
        f"{head}{held} start "
        f"{' / '.join(_f(by[(held, s)]) for s in seeds)}, grpo start "
        f"{' / '.join(_f(by[('grpo', s)]) for s in seeds)} "
        f"(seed{'s' * (len(seeds) > 1)} {' / '.join(map(str, seeds))}); mean gain {_f(mean)}"
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


# make sequential's default output; the results measured on this project's machine (each with
# its date and provenance) ship with the package in data/
SEQUENTIAL_SUMMARY = Path("runs/sequential/summary.json")
RECORDED = "data"


def measured_line(path: Path = SEQUENTIAL_SUMMARY) -> dict[str, str] | None:
    """The newest recorded sequential result, for the demo's report: ``{"source", "date",
    "line"}``. The candidates are every result shipped in ``data/`` and ``path`` when it holds
    a finished summary (dated by its ``date``, else by the file's time); the newest date wins,
    ``path`` on a tie."""
    # (date, 1 for the local run so that it wins a tie, source, summary)
    found: list[tuple[str, int, str, dict[str, Any]]] = []
    for item in resources.files("entrogym.experiments").joinpath(RECORDED).iterdir():
        if item.name.startswith("sequential-") and item.name.endswith(".json"):
            shipped = json.loads(item.read_text())
            found.append((shipped["date"], 0, shipped["provenance"], shipped))
    try:
        summary = json.loads(path.read_text())
        headline(summary)  # a finished one
        date = summary.get("date") or time.strftime(
            "%Y-%m-%d", time.localtime(path.stat().st_mtime)
        )
        found.append((date, 1, str(path), summary))
    except (OSError, ValueError, KeyError, TypeError):  # none there, or not a finished one
        pass
    if not found:
        return None
    date, _, source, newest = max(found, key=lambda c: c[:2])
    return {"source": source, "date": date, "line": headline(newest)}


def plot_sequential(summary: dict[str, Any], out: Path) -> list[Path]:
    """``stage1_entropy.png`` (each run's entropy on A, the held run's target band once per
    seed), ``stage2_reward.png`` (each run's reward on B per iteration) and, when stage 2 was
    evaluated more often than first and last, ``stage2_accuracy.png`` (its held-out curves)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    labels = list(dict.fromkeys(r["label"] for r in summary["runs"]))
    colors = {label: f"C{i}" for i, label in enumerate(labels)}
    written = []
    panels = [
        (
            "stage1_entropy.png",
            "stage1",
            "entropy",
            "entropy on A as tracked (nats / token; relative: ratio to base)",
        ),
        ("stage2_reward.png", "stage2", "reward", "reward on B"),
    ]
    if summary.get("settings", {}).get("stage2_eval_every"):
        panels.append(("stage2_accuracy.png", "stage2", "accuracy_curve", "held-out accuracy on B"))
    for name, stage, key, ylabel in panels:
        fig, ax = plt.subplots(figsize=(7, 4))
        try:
            seen: set[str] = set()
            for run in summary["runs"]:
                values = run[stage][key]
                # a curve is [iteration, value] pairs; the other panels one value per iteration
                curve = key == "accuracy_curve"
                xs = [x for x, _ in values] if curve else list(range(len(values)))
                ys = [y for _, y in values] if curve else values
                label = None if run["label"] in seen else run["label"]
                seen.add(run["label"])
                ax.plot(xs, ys, color=colors[run["label"]], label=label, alpha=0.85,
                        linewidth=1.2)  # fmt: skip
                if stage == "stage1" and run["label"] == summary["held"]:
                    target = run["stage1"]["entropy_target"]
                    its = range(len(target))
                    ax.fill_between(its, [t * (1 - BAND) for t in target],
                                    [t * (1 + BAND) for t in target], color="0.5", alpha=0.12,
                                    linewidth=0)  # fmt: skip
            ax.set_xlabel("iteration")
            ax.set_ylabel(ylabel)
            ax.legend(fontsize="small")
            fig.savefig(out / name, dpi=120, bbox_inches="tight")
        finally:
            plt.close(fig)
        written.append(out / name)
    return written
