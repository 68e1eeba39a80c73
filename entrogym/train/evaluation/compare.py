"""Runs side by side: the paper's algorithm table and its claims, from run folders.

``entrogym compare RUN [RUN ...]`` reads each run folder (``metrics.jsonl``, ``config.yaml``
and, where present, a second split's ``RUN/<challenge>/eval.json`` from ``entrogym eval``) and
gives:

* one line per run: its final and best eval accuracy (TGC on the world), the second split's,
  the entropy curve's first, lowest and last values and its cumulative sum, the entropy by turn
  index in the last iteration, how many iterations had no gradient signal (every group's
  rewards equal, so every advantage 0) and from which iteration on none had any, and the
  input dependence (``--input-dependence-every``) first and last;
* one line per configuration (runs grouped by label: the folder's name without its ``-sN``
  seed suffix), with the final accuracy's mean over seeds and its 95 % interval
  (:mod:`entrogym.train.evaluation.interval`);
* the paper's claims as paired differences over the seeds both configurations ran
  (:data:`PAPER_CLAIMS`; more with ``--claims``), each with a verdict from its interval;
* how final accuracy goes with cumulative entropy (the paper's Figure 1), with the last
  entropy, and with the last input dependence (RAGEN-2's question: which of the two tracks
  success), as Pearson's and Spearman's correlation over every run.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from entrogym.train.evaluation.correlation import Correlation, correlation_of
from entrogym.train.evaluation.interval import Interval, mean_interval
from entrogym.train.evaluation.plots import cumulative_at, load_run
from entrogym.train.evaluation.target_tracking import FIRST_TRACKED, filled_targets, max_excursion
from entrogym.train.folder.layout import label_and_seed, saved_config

# The paper's claims that a side-by-side table can test, as "A>B:measure": A's measure is
# larger than B's, paired by seed. Multi-step (PPO-like) updates deplete entropy faster than
# on-policy RLOO (section 4); the entropy-preserving methods score above their baselines
# (REPO-R over GRPO, ADAPO over DAPO; Table 1). ``held`` is the label the world's experiment
# gives GRPO with the entropy constraint held at a target.
PAPER_CLAIMS = (
    "rloo>grpo:cumulative_entropy",
    "repo-r>grpo:final_accuracy",
    "adapo>dapo:final_accuracy",
    "held>grpo:final_accuracy",
)
MEASURES = ("final_accuracy", "best_accuracy", "challenge", "entropy_last", "entropy_drop",
            "cumulative_entropy", "input_dependence_last")  # fmt: skip


@dataclass
class RunSummary:
    """What one run folder says, in the measures the claims compare."""

    path: str
    label: str
    seed: int | None
    algo: str
    iterations: int
    final_iteration: int | None = None
    final_accuracy: float | None = None
    best_accuracy: float | None = None
    challenge: float | None = None
    entropy_first: float | None = None
    entropy_min: float | None = None
    entropy_last: float | None = None
    entropy_drop: float | None = None
    cumulative_entropy: float | None = None
    entropy_by_turn: dict[str, float] = field(default_factory=dict)
    no_signal_iterations: int = 0
    signal_lost_at: int | None = None
    input_dependence_first: float | None = None
    input_dependence_last: float | None = None
    tracking_excursion: float | None = None  # runs with a controller only


def has_no_controller(run_dir: Path) -> bool:
    """Its saved config sets ``algo.controller`` to null. The trainer logs every run's first
    entropy as ``entropy_target`` (the drift is reported from it), so only a run with a
    controller tracked a target; a config without the key says nothing either way."""
    algo = saved_config(run_dir).get("algo")
    return isinstance(algo, dict) and "controller" in algo and algo["controller"] is None


def signal_lost_at(no_signal: list[tuple[int, bool]]) -> int | None:
    """The first iteration from which every later one had no gradient signal; None when the
    last iteration had some. ``no_signal`` is (iteration, no signal) in iteration order."""
    lost = None
    for iteration, none in no_signal:
        lost = (lost if lost is not None else iteration) if none else None
    return lost


def summarize_run(run_dir: str | Path, *, split: str | None = None,
                  challenge: str = "challenge") -> RunSummary:  # fmt: skip
    """One run folder's :class:`RunSummary` (eval rows of ``split`` only, if given; the second
    split from ``RUN/<challenge>/eval.json``)."""
    path = Path(run_dir)
    run = load_run(path, split=split)
    label, seed = label_and_seed(path)
    out = RunSummary(str(path), label, seed, run.algo, len(run.train_rows))
    if run.accuracy:
        out.final_iteration = max(run.accuracy)
        out.final_accuracy = run.accuracy[out.final_iteration]
        out.best_accuracy = max(run.accuracy.values())
        out.cumulative_entropy = cumulative_at(run, out.final_iteration)
    if run.entropy:
        curve = [run.entropy[it] for it in sorted(run.entropy)]
        out.entropy_first, out.entropy_min, out.entropy_last = curve[0], min(curve), curve[-1]
        out.entropy_drop = curve[0] - curve[-1]
    rows = run.train_rows
    if rows:
        out.entropy_by_turn = {
            str(k): float(v) for k, v in (rows[-1].get("entropy_by_turn") or {}).items()
        }
        flags = [(int(r["iteration"]), _no_signal(r)) for r in rows]
        out.no_signal_iterations = sum(none for _, none in flags)
        out.signal_lost_at = signal_lost_at(flags)
        out.tracking_excursion = None if has_no_controller(path) else tracking_excursion(rows)
        dependence = [r["input_dependence"] for r in rows if _number(r.get("input_dependence"))]
        if dependence:
            out.input_dependence_first, out.input_dependence_last = dependence[0], dependence[-1]
    second = path / challenge / "eval.json"
    if second.is_file():
        summary = json.loads(second.read_text()).get("summary", {})
        value = summary.get("tgc", summary.get("accuracy"))
        out.challenge = float(value) if _number(value) else None
    return out


def tracking_excursion(rows: list[dict[str, Any]]) -> float | None:
    """The largest |H_t / H*_t - 1| from the 3rd iteration on (the tracking goal's measure, as
    the demo reads it: the entropy the controller tracked against its target); None for a run
    without a target."""
    targets = [r.get("entropy_target") for r in rows]
    if not any(_number(t) for t in targets):
        return None
    entropy = [r.get("entropy_tracked", r.get("entropy")) for r in rows]
    if not all(_number(h) for h in entropy):
        return None
    return max_excursion(entropy, filled_targets(targets, entropy),
                         start=min(FIRST_TRACKED, len(rows) - 1))  # fmt: skip


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _no_signal(row: dict[str, Any]) -> bool:
    """Every group of the iteration had equal rewards, so every advantage was 0."""
    groups, zero = row.get("groups"), row.get("zero_adv_groups")
    return _number(groups) and _number(zero) and groups > 0 and zero >= groups


@dataclass
class GroupSummary:
    """One configuration over its seeds."""

    label: str
    seeds: list[int | None]
    final_accuracy: Interval | None
    challenge_mean: float | None
    entropy_last_mean: float | None
    no_signal_mean: float
    entropy_by_turn_mean: dict[str, float]
    tracking_worst: float | None  # the largest excursion over its seeds (runs with a controller)


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def summarize_groups(runs: list[RunSummary]) -> list[GroupSummary]:
    """The runs grouped by label, in the order the labels first appear."""
    groups: dict[str, list[RunSummary]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    out = []
    for label, members in groups.items():
        finals = [r.final_accuracy for r in members if r.final_accuracy is not None]
        turns = sorted({t for r in members for t in r.entropy_by_turn}, key=int)
        out.append(GroupSummary(
            label, [r.seed for r in members],
            mean_interval(finals) if finals else None,
            _mean([r.challenge for r in members]),
            _mean([r.entropy_last for r in members]),
            sum(r.no_signal_iterations for r in members) / len(members),
            {t: _mean([r.entropy_by_turn.get(t) for r in members]) for t in turns},
            max((r.tracking_excursion for r in members if r.tracking_excursion is not None),
                default=None),
        ))  # fmt: skip
    return out


@dataclass
class Claim:
    """``a``'s ``measure`` above ``b``'s, paired by seed."""

    text: str
    a: str
    b: str
    measure: str
    seeds: list[int | None]
    difference: Interval | None
    verdict: str


def parse_claim(text: str) -> tuple[str, str, str]:
    """``"A>B:measure"`` as (A, B, measure); a ValueError saying the form otherwise."""
    match = re.fullmatch(r"\s*([^>:\s]+)\s*>\s*([^>:\s]+)\s*:\s*(\w+)\s*", text)
    if not match or match[3] not in MEASURES:
        raise ValueError(
            f"claim {text!r}: write it as A>B:MEASURE (two run labels, MEASURE one of "
            f"{', '.join(MEASURES)}), e.g. repo-r>grpo:final_accuracy"
        )
    return match[1], match[2], match[3]


def check_claim(text: str, runs: list[RunSummary]) -> Claim:
    """The claim's paired differences over the seeds both labels ran (runs without a seed pair
    with nothing) and its verdict: ``shows`` when the 95 % interval lies above 0, ``reversed``
    when below, ``unclear`` when it spans 0, else why there is no interval."""
    a, b, measure = parse_claim(text)

    def by_seed(label: str) -> dict[int, float]:
        return {r.seed: getattr(r, measure) for r in runs
                if r.label == label and r.seed is not None and getattr(r, measure) is not None}  # fmt: skip

    left, right = by_seed(a), by_seed(b)
    seeds = sorted(set(left) & set(right))
    diffs = [left[s] - right[s] for s in seeds]
    interval = mean_interval(diffs) if diffs else None
    if not seeds:
        missing = [x for x, got in ((a, left), (b, right)) if not got]
        verdict = f"not run ({', '.join(missing) or 'no common seed'})"
    elif interval is None or interval.low is None:
        verdict = f"too few seeds ({len(seeds)})"
    elif interval.above(0):
        verdict = "shows"
    elif interval.below(0):
        verdict = "reversed"
    else:
        verdict = "unclear"
    return Claim(text, a, b, measure, list(seeds), interval, verdict)


def correlations(runs: list[RunSummary]) -> dict[str, Correlation | None]:
    """Final accuracy against cumulative entropy, last entropy and last input dependence, one
    point per run that has both (None with fewer than 3 such runs)."""
    out = {}
    for measure in ("cumulative_entropy", "entropy_last", "input_dependence_last"):
        points = [(r.path, getattr(r, measure), r.final_accuracy) for r in runs
                  if r.final_accuracy is not None and getattr(r, measure) is not None]  # fmt: skip
        out[measure] = correlation_of(points)
    return out


def compare(run_dirs: list[str | Path], *, split: str | None = None,
            challenge: str = "challenge", claims: tuple[str, ...] = PAPER_CLAIMS) -> dict[str, Any]:  # fmt: skip
    """Everything :mod:`entrogym.train.evaluation.compare` reports, as one JSON-ready dict."""
    if not run_dirs:
        raise ValueError("compare: give at least one run folder")
    for text in claims:
        parse_claim(text)  # bad input fails before any folder is read
    runs = [summarize_run(d, split=split, challenge=challenge) for d in run_dirs]
    return {
        "runs": [asdict(r) for r in runs],
        "groups": [asdict(g) for g in summarize_groups(runs)],
        "claims": [asdict(check_claim(text, runs)) for text in claims],
        "correlations": {k: asdict(c) if c else None for k, c in correlations(runs).items()},
    }


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_report(result: dict[str, Any]) -> str:
    """The comparison as text: runs, configurations, claims, correlations."""
    lines = [
        f"{'run':<22} {'seed':>4} {'its':>3} {'final':>5} {'best':>5} {'2nd':>5} "
        f"{'H0':>5} {'Hmin':>5} {'Hlast':>5} {'cumH':>6} {'nosig':>5} {'lost':>4} "
        f"{'dep0':>5} {'dep':>5} {'track':>5}  H by turn (last iteration)"
    ]
    for r in result["runs"]:
        turns = " ".join(f"{v:.2f}" for _, v in sorted(r["entropy_by_turn"].items(),
                                                         key=lambda kv: int(kv[0])))  # fmt: skip
        lines.append(
            f"{Path(r['path']).name[:22]:<22} {str(r['seed']):>4} {r['iterations']:>3} "
            f"{_f(r['final_accuracy']):>5} {_f(r['best_accuracy']):>5} {_f(r['challenge']):>5} "
            f"{_f(r['entropy_first']):>5} {_f(r['entropy_min']):>5} {_f(r['entropy_last']):>5} "
            f"{_f(r['cumulative_entropy'], 1):>6} {r['no_signal_iterations']:>5} "
            f"{str(r['signal_lost_at'] if r['signal_lost_at'] is not None else '-'):>4} "
            f"{_f(r['input_dependence_first']):>5} {_f(r['input_dependence_last']):>5} "
            f"{_f(r['tracking_excursion']):>5}  {turns}"
        )
    lines += ["", f"{'configuration':<16} {'seeds':<10} final accuracy: mean [95 % interval]"
                  "        2nd  Hlast  nosig  track"]  # fmt: skip
    for g in result["groups"]:
        final = g["final_accuracy"]
        shown = "-" if final is None else Interval(**final).text(signed=False)
        seeds = ",".join(str(s) for s in g["seeds"])
        lines.append(
            f"{g['label'][:16]:<16} {seeds[:10]:<10} {shown:<44} {_f(g['challenge_mean']):>4} "
            f"{_f(g['entropy_last_mean']):>6} {g['no_signal_mean']:>6.1f} "
            f"{_f(g['tracking_worst']):>6}"
        )
    lines += ["", "claims (paired by seed, A - B):"]
    for c in result["claims"]:
        diff = "-" if c["difference"] is None else Interval(**c["difference"]).text()
        lines.append(f"  {c['text']:<30} {diff:<44} {c['verdict']}")
    lines += ["", "final accuracy against, over runs:"]
    for measure, corr in result["correlations"].items():
        if corr is None:
            lines.append(f"  {measure:<22} fewer than 3 runs with both")
        else:
            lines.append(f"  {measure:<22} Pearson r = {corr['pearson']:+.2f}, "
                         f"Spearman rho = {corr['spearman']:+.2f} ({corr['runs']} runs)")  # fmt: skip
    return "\n".join(lines)
