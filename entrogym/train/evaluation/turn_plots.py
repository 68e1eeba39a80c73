"""``turns.png``: the per-turn metrics of multi-turn runs (``entrogym plot``), six panels:

turns per episode, what ended the episodes, tool calls and failed calls per episode (each
against iteration), the entropy by turn index (each run's first and last iteration), the
mean reward by turn count (over every iteration) and the distribution of turn counts (each
run's last iteration). The fields are :mod:`entrogym.train.folder.turn_metrics`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI

from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from entrogym.train.folder.turn_metrics import END_REASONS  # noqa: E402

# A run as the panels take it: its label and its train rows, one per iteration, in order.
LabelledRows = tuple[str, Sequence[dict[str, Any]]]


def _color(k: int) -> str:
    """Run ``k``'s colour, the same in every panel: the colour cycle's k-th."""
    return f"C{k % 10}"


def has_turns(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether ``rows`` hold per-turn metrics worth a figure: episodes of more than one turn,
    or tool calls."""
    return any(
        r.get("turns_mean") is not None
        and ((r.get("turns_max") or 0) > 1 or r.get("tool_calls") or r.get("tool_errors"))
        for r in rows
    )


def _per_episode(row: dict[str, Any], key: str) -> float | None:
    episodes = sum((row.get("turns_hist") or {}).values())
    return row[key] / episodes if episodes and row.get(key) is not None else None


def _against_iteration(ax: Axes, runs: list[LabelledRows], key: str) -> None:
    for k, (label, rows) in enumerate(runs):
        points = [(r["iteration"], r.get(key)) for r in rows if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), color=_color(k), label=label)


def _end_reasons(ax: Axes, runs: list[LabelledRows]) -> None:
    """Share of the episodes each reason ended, pooled over the runs, stacked."""
    counts: dict[int, dict[str, int]] = {}
    for _, rows in runs:
        for r in rows:
            pooled = counts.setdefault(r["iteration"], dict.fromkeys(END_REASONS, 0))
            for reason, n in (r.get("end_reasons") or {}).items():
                pooled[reason] = pooled.get(reason, 0) + n
    its = sorted(counts)
    totals = [max(sum(counts[it].values()), 1) for it in its]
    seen = [reason for reason in END_REASONS if any(counts[it][reason] for it in its)]
    shares = [
        [counts[it][reason] / t for it, t in zip(its, totals, strict=True)] for reason in seen
    ]
    if its and seen:
        ax.stackplot(its, shares, labels=seen, alpha=0.8)


def _by_turn(ax: Axes, runs: list[LabelledRows]) -> None:
    """Each run's entropy by turn index at its first iteration (dashed) and its last."""
    for k, (label, rows) in enumerate(runs):
        measured = [r for r in rows if r.get("entropy_by_turn")]
        if not measured:
            continue
        ends = [(measured[-1], "-", label)]
        if len(measured) > 1:
            ends.insert(0, (measured[0], "--", f"{label}, iteration {measured[0]['iteration']}"))
        for row, style, name in ends:
            by_turn = row["entropy_by_turn"]
            turns, values = [int(j) for j in by_turn], list(by_turn.values())
            ax.plot(turns, values, style, marker="o", color=_color(k), label=name)


def _reward_by_turns(ax: Axes, runs: list[LabelledRows]) -> None:
    """Each run's mean reward by turn count over every iteration, weighted by the episodes
    of each count."""
    for k, (label, rows) in enumerate(runs):
        sums: dict[int, list[float]] = {}
        for r in rows:
            for n, reward in (r.get("reward_by_turns") or {}).items():
                weight = (r.get("turns_hist") or {}).get(n, 1)
                pair = sums.setdefault(int(n), [0.0, 0.0])
                pair[0] += reward * weight
                pair[1] += weight
        if sums:
            turns = sorted(sums)
            means = [sums[n][0] / sums[n][1] for n in turns]
            ax.plot(turns, means, marker="o", color=_color(k), label=label)


def _distribution(ax: Axes, runs: list[LabelledRows]) -> None:
    """Each run's episodes by turn count at its last iteration, as side-by-side bars."""
    width = 0.8 / max(len(runs), 1)
    for k, (label, rows) in enumerate(runs):
        last = next((r for r in reversed(rows) if r.get("turns_hist")), None)
        if last is None:
            continue
        hist = last["turns_hist"]
        xs = [int(n) + (k - (len(runs) - 1) / 2) * width for n in hist]
        ax.bar(
            xs, list(hist.values()), width=width, label=f"{label}, iteration {last['iteration']}"
        )


def turns_figure(runs: list[LabelledRows]) -> Figure | None:
    """The six panels for ``runs``, or None when none of them has per-turn metrics worth
    drawing (:func:`has_turns`: single-turn runs without tool calls)."""
    runs = [(label, rows) for label, rows in runs if has_turns(rows)]
    if not runs:
        return None
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    (turns, ended, tools), (entropy, reward, hist) = axes
    _against_iteration(turns, runs, "turns_mean")
    turns.set(title="Turns per episode", xlabel="iteration", ylabel="mean turns")
    _end_reasons(ended, runs)
    ended.set(title="What ended the episodes", xlabel="iteration", ylabel="share of episodes")
    for k, (label, rows) in enumerate(runs):
        for key, style in (("tool_calls", "-"), ("tool_errors", "--")):
            points = [(r["iteration"], _per_episode(r, key)) for r in rows]
            points = [p for p in points if p[1] is not None]
            if points:
                name = label if key == "tool_calls" else None  # one legend entry per run
                tools.plot(*zip(*points, strict=True), style, color=_color(k), label=name)
    tools.set(title="Tool calls (solid) and failed calls (dashed)", xlabel="iteration",
              ylabel="per episode")  # fmt: skip
    _by_turn(entropy, runs)
    entropy.set(title="Entropy by turn (sampled, nats)", xlabel="turn", ylabel="-mean log p")
    _reward_by_turns(reward, runs)
    reward.set(title="Reward by turn count", xlabel="turns in the episode", ylabel="mean reward")
    _distribution(hist, runs)
    hist.set(title="Turns per episode (last iteration)", xlabel="turns", ylabel="episodes")
    for ax in axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations and turns
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
    fig.tight_layout()
    return fig
