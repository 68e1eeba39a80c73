"""Summary, claim checks, plot and files of the bandit lab (``entrogym bandit``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from entrogym.algos import ALGORITHMS, AlgorithmConfig
from entrogym.algos.algorithm import target_params
from entrogym.atomic import atomic_path, atomic_write_text
from entrogym.experiments.lab_config import LabConfig
from entrogym.train.evaluation.target_tracking import max_excursion, tracking_error

# REPO-R and ADAPO should hold entropy near the target: final within this share of the initial.
HOLD_TOLERANCE = 0.25
# The band the plot draws around the target, and the tighter hold of the regime map.
TARGET_BAND = 0.10
RESERVED_KEYS = ("claims", "config")


def target_entropies(config: AlgorithmConfig | None, initial: np.ndarray) -> np.ndarray:
    """The exact entropy each seed's run aims at: the controller's target as a ratio of the
    initial exact entropy, or in nats; without a controller that has one, the initial entropy
    itself."""
    params = None if config is None else target_params(config)
    if params is None:
        return initial.copy()
    if params.target_unit == "nats":
        return np.full_like(initial, params.target)
    return params.target * initial


def tracking(entropy: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    """(``tracking_error``, ``max_excursion``) of ``entropy[seeds, 1 + iters]`` (column 0 the
    initial policy) against ``target[seeds]``: the mean over seeds of each seed's tracking
    error, and the largest deviation of any seed, both over the second half of the iterations
    (``entrogym.train.evaluation.target_tracking``)."""
    errors, excursions = [], []
    for curve, aim in zip(entropy[:, 1:], target, strict=True):
        errors.append(tracking_error(curve.tolist(), float(aim)))
        excursions.append(max_excursion(curve.tolist(), float(aim)))
    return float(np.mean(errors)), float(max(excursions))


def _presets(lab: LabConfig) -> dict[str, str]:
    """Each run's preset by the label its rows carry."""
    return {run.label: run.preset for run in lab.algos}


def _curves(rows: list[dict[str, Any]], initials: dict, algo: str, key: str) -> np.ndarray:
    """[seeds, iters + 1] curve of ``key`` ("entropy" or "reward"), column 0 = initial policy."""
    seeds = sorted({r["seed"] for r in rows if r["algo"] == algo})
    curves = []
    for seed in seeds:
        values = [r[key] for r in rows if r["algo"] == algo and r["seed"] == seed]
        curves.append([initials[algo, seed][key], *values])
    return np.array(curves, dtype=np.float64)


def summarize(rows: list[dict[str, Any]], initials: dict, lab: LabConfig) -> dict[str, Any]:
    """Per algorithm, means over seeds of the exact entropy and expected reward.

    ``cumulative_entropy`` sums, over iterations, the exact entropy of the policy that collected
    that iteration's experience (the entropy "experienced during training", paper Fig. 1).
    """
    summary: dict[str, Any] = {}
    configs = {run.label: run.algorithm for run in lab.algos}
    for algo in dict.fromkeys(r["algo"] for r in rows):
        entropy, reward = (
            _curves(rows, initials, algo, "entropy"),
            _curves(rows, initials, algo, "reward"),
        )
        target = target_entropies(configs.get(algo), entropy[:, 0])
        tracking_error, max_excursion = tracking(entropy, target)
        summary[algo] = {
            "entropy_initial": float(entropy[:, 0].mean()),
            "entropy_final": float(entropy[:, -1].mean()),
            "entropy_final_std": float(entropy[:, -1].std()),
            "entropy_final_ratio": float((entropy[:, -1] / entropy[:, 0]).mean()),
            "reward_initial": float(reward[:, 0].mean()),
            "reward_final": float(reward[:, -1].mean()),
            "cumulative_entropy": float(entropy[:, :-1].sum(axis=1).mean()),
            "entropy_target": float(target.mean()),
            "tracking_error": tracking_error,
            "max_excursion": max_excursion,
            "seeds": int(entropy.shape[0]),
        }
    summary["claims"] = check_claims(summary, _presets(lab))
    summary["config"] = lab.record()
    return summary


def check_claims(summary: dict[str, Any], presets: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The paper's Sec. 3 predictions as the lab can show them (only for algorithms that ran;
    ``presets``: each run's preset by its label)."""
    claims: dict[str, dict[str, Any]] = {}

    def final(algo: str) -> float:
        return summary[algo]["entropy_final"]

    if {"grpo", "rloo"} <= summary.keys():
        claims["grpo_below_rloo"] = {
            "holds": final("grpo") < final("rloo"),
            "grpo": final("grpo"),
            "rloo": final("rloo"),
        }
    if {"dapo", "loop"} <= summary.keys():
        claims["dapo_above_loop"] = {
            "holds": final("dapo") > final("loop"),
            "dapo": final("dapo"),
            "loop": final("loop"),
        }
    for algo in ("repo-r", "adapo"):
        if algo in summary:
            ratio = final(algo) / summary[algo]["entropy_initial"]
            claims[f"{algo}_holds_entropy"] = {
                "holds": abs(ratio - 1.0) <= HOLD_TOLERANCE,
                "final_over_initial": ratio,
            }
    claims.update(controller_claims(summary, presets))
    return claims


def controller_claims(
    summary: dict[str, Any], presets: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """GRPO loses more than half of its entropy, and each other controlled run (paper cap or
    labelled variant) holds within ``HOLD_TOLERANCE``, with its reward cost against GRPO.

    The paper-cap REPO-R / ADAPO claims keep their own keys (above); this adds the rest.
    """
    claims: dict[str, dict[str, Any]] = {}
    runs = {k: v for k, v in summary.items() if k not in RESERVED_KEYS}
    grpo_reward = runs["grpo"]["reward_final"] if "grpo" in runs else None
    for label, s in runs.items():
        name = presets[label]
        ratio = s["entropy_final"] / s["entropy_initial"]
        if name == "grpo":
            claims[f"{label}_loses_half"] = {"holds": ratio < 0.5, "final_over_initial": ratio}
        elif _has_lever(name) and label not in ("repo-r", "adapo"):
            claim = {"holds": abs(ratio - 1.0) <= HOLD_TOLERANCE, "final_over_initial": ratio}
            if grpo_reward is not None:
                claim["reward_cost_vs_grpo"] = grpo_reward - s["reward_final"]
            claims[f"{label}_holds_entropy"] = claim
    return claims


def _has_lever(name: str) -> bool:
    return name in ALGORITHMS and ALGORITHMS[name].controller is not None


def plot_curves(
    rows: list[dict[str, Any]],
    initials: dict,
    path: Path,
    presets: Mapping[str, str],
    targets: dict[str, float] | None = None,
) -> None:
    """Entropy and expected reward per algorithm: mean over seeds, band = min..max over seeds;
    a run whose label is not its preset's name (``presets``: label -> preset) is a variant,
    drawn dashed in its preset's colour; grey bands mark +-10 % around each distinct target
    entropy (``targets``: label -> mean target; by default the initial entropy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = list(dict.fromkeys(r["algo"] for r in rows))
    names = list(dict.fromkeys(presets[a] for a in algos))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5 + 0.25 * -(-len(algos) // 3)))
    if targets is None:
        targets = {a: float(_curves(rows, initials, a, "entropy")[:, 0].mean()) for a in algos}
    for target in sorted({round(t, 3) for t in targets.values()}):
        axes[0].axhspan(
            target * (1 - TARGET_BAND), target * (1 + TARGET_BAND), color="0.5", alpha=0.15, lw=0
        )
    colors = plt.get_cmap("tab20" if len(names) > 10 else "tab10")
    for algo in algos:
        # A variant takes its preset's colour, dashed, so the paper-cap run sits beside it.
        color = colors(names.index(presets[algo]) % 20)
        style = "--" if algo != presets[algo] else "-"
        for ax, key in zip(axes, ("entropy", "reward"), strict=True):
            curves = _curves(rows, initials, algo, key)
            x = np.arange(curves.shape[1])
            ax.plot(x, curves.mean(axis=0), color=color, ls=style, label=algo, lw=1.5)
            ax.fill_between(x, curves.min(axis=0), curves.max(axis=0), color=color, alpha=0.12)
    axes[0].set(xlabel="iteration", ylabel="exact policy entropy (nats, mean over states)")
    axes[1].set(xlabel="iteration", ylabel="expected reward")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(
        "Bandit lab: tabular softmax policy (mean over seeds, band = min..max; dashed = variant; "
        f"grey = target entropy +-{TARGET_BAND:.0%})"
    )
    rows_of_legend = -(-len(algos) // 3)
    fig.tight_layout(rect=(0, 0.035 * rows_of_legend, 1, 1))
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)


def write_outputs(
    out: Path, rows: list[dict[str, Any]], summary: dict[str, Any], initials: dict, lab: LabConfig
) -> None:
    """``out/metrics.jsonl``, ``out/summary.json`` and ``out/entropy.png``, each written atomically."""
    atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    targets = {k: v["entropy_target"] for k, v in summary.items() if k not in RESERVED_KEYS}
    plot_curves(rows, initials, out / "entropy.png", _presets(lab), targets)


def format_table(summary: dict[str, Any]) -> str:
    """The summary as an aligned text table followed by the claim checks."""
    width = max([20, *(len(k) for k in summary if k not in RESERVED_KEYS)])
    header = (
        f"{'algorithm':<{width}} {'H init':>7} {'H final':>8} {'final/init':>10} "
        f"{'track err':>9} {'max exc':>8} {'R init':>7} {'R final':>8} {'cum H':>8}"
    )
    lines = [header, "-" * len(header)]
    for algo, s in summary.items():
        if algo in RESERVED_KEYS:
            continue
        lines.append(
            f"{algo:<{width}} {s['entropy_initial']:>7.3f} {s['entropy_final']:>8.3f} "
            f"{s['entropy_final_ratio']:>10.2f} {s['tracking_error']:>9.3f} "
            f"{s['max_excursion']:>8.3f} {s['reward_initial']:>7.3f} "
            f"{s['reward_final']:>8.3f} {s['cumulative_entropy']:>8.1f}"
        )
    for name, claim in summary.get("claims", {}).items():
        detail = ", ".join(f"{k} {v:.3f}" for k, v in claim.items() if k != "holds")
        lines.append(f"claim {name}: {'holds' if claim['holds'] else 'DOES NOT HOLD'} ({detail})")
    return "\n".join(lines)
