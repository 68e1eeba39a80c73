"""What the demo shows: the goal's check per seed, the table, the verdict and the plots."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from entrogym.experiments.config import ACCURACY_SLACK, BAND, FALL, FIRST_TRACKED
from entrogym.train.evaluation.target_tracking import filled_targets, max_excursion, tracking_error

# The report's width, and the longest label the table's run column shows (a longer one is
# shown as run#N, with its full label under the table).
WIDTH, LABEL_WIDTH = 100, 14


def shown_names(records: list[dict[str, Any]]) -> dict[str, str]:
    """Each run label's name in the table, the log and the plots: the label itself, or ``run#N``
    (N: its place among the runs; no label has a ``#``) where it is longer than LABEL_WIDTH."""
    labels = list(dict.fromkeys(r["label"] for r in records))
    return {label: label if len(label) <= LABEL_WIDTH else f"run#{i}"
            for i, label in enumerate(labels, start=1)}  # fmt: skip


def plot_demo(records: list[dict[str, Any]], out: Path) -> list[Path]:
    """The paper's Figure 1 panels, one line per run and seed under its short name (with the
    seed where there are several); the entropy panel also draws the held run's target (dashed)
    with the goal's +-BAND around it, once per distinct target. The held run is the last
    controlled run, as in the default runs (``held``) and the sequential experiment; the other
    controlled runs' targets (REPO-R's: its first iteration's entropy) are not drawn, so that
    one band reads as the one the goal is about."""
    from matplotlib import pyplot as plt

    from entrogym.train.evaluation.plots import accuracy_vs_entropy_figure, entropy_figure, load_run

    names = shown_names(records)
    several_seeds = len({r["seed"] for r in records}) > 1
    held = next((r["label"] for r in reversed(records) if r.get("controlled")), None)
    runs, targets = [], {}
    for r in records:
        name = names[r["label"]] + (f" s{r['seed']}" if several_seeds else "")
        run = load_run(Path(r["folder"]))
        run.algo = name  # the plots group by this name: a variant must not merge with its preset
        if r.get("controlled") and r.get("entropy_tracked"):
            # the line its band is about: what its controller tracked (exact, sampled or on the
            # probe's fixed states), not the batch's sampled entropy the metrics row leads with
            run.entropy = dict(enumerate(r["entropy_tracked"]))
        runs.append(run)
        if r["label"] == held and all(t is not None for t in r.get("entropy_target") or [None]):
            targets[name] = r["entropy_target"]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in (("entropy.png", entropy_figure),
                       ("accuracy_vs_cumulative_entropy.png", accuracy_vs_entropy_figure)):  # fmt: skip
        fig = make(runs)
        try:
            if name == "entropy.png":
                draw_bands(fig.axes[0], targets)
            fig.savefig(out / name, dpi=120, bbox_inches="tight")
        finally:
            plt.close(fig)
        written.append(out / name)
    return written


def draw_bands(ax: Any, targets: dict[str, list[float]]) -> list[str]:
    """One dashed target line and one +-BAND band per distinct target, labelled shortly with
    the runs that share it (``held +-25%``); the legend labels of the bands drawn."""
    shared: dict[tuple[float, ...], list[str]] = {}
    for name, target in targets.items():
        if target:
            shared.setdefault(tuple(round(t, 3) for t in target), []).append(name)
    drawn = []
    for key, names in shared.items():
        its = list(range(len(key)))
        label = f"{', '.join(names)} ±{BAND:.0%}"
        ax.plot(its, key, linestyle="--", color="0.4", linewidth=1)
        ax.fill_between(its, [t * (1 - BAND) for t in key], [t * (1 + BAND) for t in key],
                        color="0.5", alpha=0.12, linewidth=0, label=label)  # fmt: skip
        drawn.append(label)
    if drawn:
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.15))
    return drawn


def tracking(record: dict[str, Any]) -> dict[str, float]:
    """``tracking_error`` (mean over the second half) and ``max_excursion`` (the largest
    |H_t / H*_t - 1| from the goal's first tracked iteration on) of a run against its target;
    a run without a target (GRPO) against its first iteration's entropy. The entropy is the
    one the controller tracked (``entropy_tracked``: exact or sampled), in the target's terms."""
    entropy = record.get("entropy_tracked") or record["entropy"]
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
        # the baseline is the plain grpo preset, whatever it is labelled
        grpo = next((r for r in at_seed if r.get("spec", r["label"]) == "grpo"), None)
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


def verdict(result: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """Plain sentences: per seed and controlled run, whether the goal held, and why not; runs
    under ``names`` (label -> shown name; default the labels), lines within WIDTH columns."""
    if not result["checks"]:
        return ["goal not checked: it needs a grpo run and a run with a lever on the same seed"]
    names = names or {}
    band, fall = result["band"], result["fall"]
    lines = [f"goal, per seed: entropy within +-{band:.0%} of its target at every iteration "
             f"from the {_ordinal(result['first_tracked'])} on,",
             f"  GRPO ends at <= {fall:.2f} of its start, held-out accuracy >= GRPO's - "
             f"{result['accuracy_slack']:.2f}"]  # fmt: skip
    for c in result["checks"]:
        why = []
        if not c["in_band"]:
            why.append(f"its entropy left the band by {c['max_excursion']:.0%}")
        if not c["grpo_fell"]:
            why.append(f"GRPO kept {c['grpo_ratio']:.2f} of its entropy")
        if not c["accurate"]:
            why.append(f"accuracy {_accuracy(c['accuracy'])} against GRPO's "
                       f"{_accuracy(c['grpo_accuracy'])}")  # fmt: skip
        lines.append(
            f"  seed {c['seed']}, {names.get(c['run'], c['run'])}: largest excursion "
            f"{c['max_excursion']:.0%}, GRPO at {c['grpo_ratio']:.2f}, accuracy "
            f"{_accuracy(c['accuracy'])} vs {_accuracy(c['grpo_accuracy'])}"
        )
        lines.append("    HELD" if c["holds"] else "    did NOT hold: " + "; ".join(why))
    for label, held in result["held"].items():
        mine = [c for c in result["checks"] if c["run"] == label]
        n = sum(c["holds"] for c in mine)
        lines.append(f"{names.get(label, label)}: goal {'HELD' if held else 'did NOT hold'} "
                     f"({n} of {len(mine)} seeds)")  # fmt: skip
    return [_fit(line) for line in lines]


def _fit(line: str) -> str:
    """``line`` wrapped at WIDTH, continuation lines indented past its own indent."""
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.fill(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False)


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def _accuracy(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _pair(first: float | None, last: float | None, fmt: str = ".3f") -> str:
    shown = ["-" if v is None else format(v, fmt) for v in (first, last)]
    return f"{shown[0]} -> {shown[1]}"


def story(summary: dict[str, Any], names: dict[str, str]) -> list[str]:
    """The report's first lines, the paper's story in the demo's numbers: per seed, GRPO's
    entropy against each controlled run's; pass@k of every final policy and the base model;
    the sequential experiment's line (``summary["sequential"]``) and the multi-turn world's
    (``summary["world"]``), where there are."""
    records = summary["runs"]
    lines = []
    for seed in sorted({r["seed"] for r in records}):
        for r in (r for r in records if r["seed"] == seed):
            e, name = r["entropy"], names[r["label"]]
            if r.get("controlled"):
                how = f"at most {tracking(r)['max_excursion']:.0%} from its target from the " \
                      f"{_ordinal(FIRST_TRACKED + 1)} iteration on"  # fmt: skip
            else:
                how = f"{r['entropy_ratio']:.2f} of its start"
            lines.append(f"seed {seed}, {name}: entropy {e[0]:.3f} -> {e[-1]:.3f}, {how}")
    scored = [("base model", summary.get("base_pass_at_k"))]
    scored += [(f"{names[r['label']]} s{r['seed']}", r.get("pass_at_k")) for r in records]
    scored = [(name, p) for name, p in scored if p]
    if scored:
        ks = [k for k in scored[0][1] if k.isdigit()]
        settings = summary["settings"]
        lines.append(f"pass@k on {settings['pass_tasks']} held-out tasks x "
                     f"{settings['pass_samples']} samples" + "".join(f"{'@' + k:>7}" for k in ks))  # fmt: skip
        width = len(lines[-1]) - 7 * len(ks)
        lines += [f"  {name:<{width - 2}}" + "".join(f"{p[k]:>7.3f}" for k in ks)
                  for name, p in scored]  # fmt: skip
    if summary.get("sequential"):
        newest = summary["sequential"]
        lines.append(_fit(f"sequential, newest recorded ({newest.get('date', 'undated')}; "
                          f"{newest['source']}): {newest['line']}"))  # fmt: skip
    if summary.get("world"):
        lines.append(world_story_line(summary["world"]))
    return lines


def world_story_line(world: dict[str, str]) -> str:
    """The multi-turn world's recorded line (``world_record.recorded_world``), wrapped."""
    return _fit(f"the multi-turn world ({world['date']}; {world['source']}): {world['line']}")


def report(summary: dict[str, Any]) -> str:
    """The paper's story first (:func:`story`), then the table (one row per run and seed, each
    run under its short name), what each named run is, then the goal's verdict; no line wider
    than WIDTH."""
    records = summary["runs"]
    names = shown_names(records)
    width = max([len("run"), *(len(names[r["label"]]) for r in records)])
    columns = (("seed", 4), ("entropy 1st->last", 17), ("track", 5), ("max exc", 7),
               ("reward 1st->last", 16), ("accuracy 1st->last", 18), ("wall", 5))  # fmt: skip
    lines = [
        *story(summary, names),
        "",
        f"held-out accuracy of the base model: {_accuracy(summary.get('accuracy_before'))}",
        f"{'run':<{width}}" + "".join(f"  {title:>{w}}" for title, w in columns),
    ]
    for r in records:
        t = tracking(r)
        cells = (r["seed"], _pair(r["entropy"][0], r["entropy"][-1]),
                 f"{t['tracking_error']:.2f}", f"{t['max_excursion']:.2f}",
                 _pair(r["reward"][0], r["reward"][-1]),
                 _pair(r["accuracy_first"], r["accuracy_after"]), f"{r['wall_s']:.0f}s")  # fmt: skip
        row = "".join(f"  {cell:>{w}}" for cell, (_, w) in zip(cells, columns, strict=True))
        lines.append(f"{names[r['label']]:<{width}}{row}")
    specs = {names[r["label"]]: r.get("spec", r["label"]) for r in records}
    named = [f"  {name} = {spec}" for name, spec in specs.items() if spec != name]
    if named:
        lines += ["runs:", *(_fit(line) for line in named)]
    lines += verdict(summary.get("goal") or goal(records), names)
    settings = summary["settings"]
    lines.append(f"wall time {summary['wall_s']:.0f} s (seeds {settings['seeds']}, "
                 f"{settings['workers']} workers x {settings['threads']} threads)")  # fmt: skip
    return "\n".join(lines)
