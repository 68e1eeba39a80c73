"""What the demo shows: the goal's check per seed, the table, the verdict and the plots."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from entrogym.demo.config import ACCURACY_SLACK, BAND, FALL, FIRST_TRACKED
from entrogym.train.tracking import filled_targets, max_excursion, tracking_error


def plot_demo(
    folders: dict[str, Path], out: Path, targets: dict[str, list[float]] | None = None
) -> list[Path]:
    """The paper's Figure 1 panels, one line per labelled run and seed; the entropy panel also
    draws each controlled run's target (dashed) and the goal's +-BAND around it."""
    from matplotlib import pyplot as plt

    from entrogym.train.plots import accuracy_vs_entropy_figure, entropy_figure, load_run

    runs = []
    for label, folder in folders.items():
        run = load_run(folder)
        # the plots group by this name (a variant must not merge with its preset); a long
        # label is wrapped so that the legend does not stretch the figure past its axes
        run.algo = textwrap.fill(label, 70, subsequent_indent="  ")
        runs.append(run)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in (("entropy.png", entropy_figure),
                       ("accuracy_vs_cumulative_entropy.png", accuracy_vs_entropy_figure)):  # fmt: skip
        fig = make(runs)
        try:
            if name == "entropy.png":
                _draw_bands(fig.axes[0], targets or {})
            # long run labels: the legend goes under the axes, and the figure grows to hold it
            fig.savefig(out / name, dpi=120, bbox_inches="tight")
        finally:
            plt.close(fig)
        written.append(out / name)
    return written


def _draw_bands(ax: Any, targets: dict[str, list[float]]) -> None:
    """One dashed target line and a +-BAND band per distinct target (runs of one seed share
    the first iteration's entropy, so they share a band)."""
    drawn: set[tuple[float, ...]] = set()
    for target in targets.values():
        key = tuple(round(t, 3) for t in target)
        if not target or key in drawn:
            continue
        drawn.add(key)
        its = list(range(len(target)))
        label = None if len(drawn) > 1 else f"target +-{BAND:.0%}"
        ax.plot(its, target, linestyle="--", color="0.4", linewidth=1)
        ax.fill_between(its, [t * (1 - BAND) for t in target], [t * (1 + BAND) for t in target],
                        color="0.5", alpha=0.12, linewidth=0, label=label)  # fmt: skip
    if drawn:
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.15))


def tracking(record: dict[str, Any]) -> dict[str, float]:
    """``tracking_error`` (mean over the second half) and ``max_excursion`` (the largest
    |H_t / H*_t - 1| from the goal's first tracked iteration on) of a run against its target;
    a run without a target (GRPO) against its first iteration's entropy."""
    entropy = record["entropy"]
    target = filled_targets(record.get("entropy_target") or [None] * len(entropy), entropy)
    start = min(FIRST_TRACKED, len(entropy) - 1)
    return {"tracking_error": tracking_error(entropy, target),
            "max_excursion": max_excursion(entropy, target, start=start)}  # fmt: skip


def goal(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The demo's goal (docs/demo.md), checked per seed for every run with a lever: its entropy
    stays within +-BAND of its target at every iteration from the 3rd on, that seed's GRPO run
    ends at <= FALL of its first iteration's entropy, and the run's last held-out accuracy is at
    most ACCURACY_SLACK below GRPO's. A run ``holds`` when that is true on every seed it ran."""
    checks = []
    for seed in sorted({r["seed"] for r in records}):
        at_seed = [r for r in records if r["seed"] == seed]
        grpo = next((r for r in at_seed if r["label"] == "grpo"), None)
        for run in (r for r in at_seed if r.get("controlled") and grpo is not None):
            excursion = tracking(run)["max_excursion"]
            accuracy, grpo_accuracy = run.get("accuracy_after"), grpo.get("accuracy_after")
            accurate = (accuracy is not None and grpo_accuracy is not None
                        and accuracy >= grpo_accuracy - ACCURACY_SLACK)  # fmt: skip
            in_band, fell = excursion <= BAND, grpo["entropy_ratio"] <= FALL
            checks.append({"run": run["label"], "seed": seed, "max_excursion": excursion,
                           "grpo_ratio": grpo["entropy_ratio"], "in_band": in_band,
                           "grpo_fell": fell, "accuracy": accuracy,
                           "grpo_accuracy": grpo_accuracy, "accurate": accurate,
                           "holds": in_band and fell and accurate})  # fmt: skip
    labels = dict.fromkeys(c["run"] for c in checks)
    held = {label: all(c["holds"] for c in checks if c["run"] == label) for label in labels}
    return {"band": BAND, "fall": FALL, "accuracy_slack": ACCURACY_SLACK,
            "first_tracked": FIRST_TRACKED + 1, "checks": checks, "held": held}  # fmt: skip


def verdict(result: dict[str, Any]) -> list[str]:
    """Plain sentences: per seed and controlled run, whether the goal held, and why not."""
    if not result["checks"]:
        return ["goal not checked: it needs a grpo run and a run with a lever on the same seed"]
    band, fall = result["band"], result["fall"]
    lines = [f"goal, per seed: entropy within +-{band:.0%} of its target at every iteration "
             f"from the {_ordinal(result['first_tracked'])} on, GRPO ends at <= {fall:.2f} of "
             f"its start, held-out accuracy >= GRPO's - {result['accuracy_slack']:.2f}"]  # fmt: skip
    for c in result["checks"]:
        why = []
        if not c["in_band"]:
            why.append(f"its entropy left the band by {c['max_excursion']:.0%}")
        if not c["grpo_fell"]:
            why.append(f"GRPO kept {c['grpo_ratio']:.2f} of its entropy")
        if not c["accurate"]:
            why.append(f"accuracy {_accuracy(c['accuracy'])} against GRPO's "
                       f"{_accuracy(c['grpo_accuracy'])}")  # fmt: skip
        word = "HELD" if c["holds"] else "did NOT hold: " + "; ".join(why)
        lines.append(
            f"  seed {c['seed']}: {c['run']}: largest excursion {c['max_excursion']:.0%}, "
            f"GRPO at {c['grpo_ratio']:.2f}, accuracy {_accuracy(c['accuracy'])} vs "
            f"{_accuracy(c['grpo_accuracy'])} -> {word}"
        )
    for label, held in result["held"].items():
        mine = [c for c in result["checks"] if c["run"] == label]
        n = sum(c["holds"] for c in mine)
        lines.append(
            f"{label}: goal {'HELD' if held else 'did NOT hold'} ({n} of {len(mine)} seeds)"
        )
    return lines


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def _accuracy(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def report(summary: dict[str, Any]) -> str:
    """The table a user sees first (one row per run and seed), then the goal's verdict."""
    records = summary["runs"]
    width = max([len("run"), *(len(r["label"]) for r in records)])
    lines = [
        f"held-out accuracy of the base model: {_accuracy(summary.get('accuracy_before'))}",
        f"{'run':<{width}} {'seed':>4} {'entropy first -> last':>22} {'track':>6} "
        f"{'max exc':>7} {'reward first -> last':>21} {'accuracy 1st -> last':>21} {'wall':>6}",
    ]
    for r in records:
        t = tracking(r)
        lines.append(
            f"{r['label']:<{width}} {r['seed']:>4} {r['entropy'][0]:>10.3f} -> "
            f"{r['entropy'][-1]:<7.3f} {t['tracking_error']:>6.2f} {t['max_excursion']:>7.2f} "
            f"{r['reward'][0]:>9.3f} -> {r['reward'][-1]:<8.3f} "
            f"{_accuracy(r['accuracy_first']):>9} -> {_accuracy(r['accuracy_after']):<8} "
            f"{r['wall_s']:>5.0f}s"
        )
    lines += verdict(summary.get("goal") or goal(records))
    settings = summary["settings"]
    lines.append(f"wall time {summary['wall_s']:.0f} s (seeds {settings['seeds']}, "
                 f"{settings['workers']} workers x {settings['threads']} threads)")  # fmt: skip
    return "\n".join(lines)
