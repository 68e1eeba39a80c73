"""Per-turn metrics of multi-turn episodes, for the train and eval rows of ``metrics.jsonl``.

From the episodes (:func:`episode_turn_metrics`): how many turns they took, what ended each
one, the tool calls their envs counted and how many failed, and the mean reward by turn count.
From a batch's log-probs (:func:`entropy_by_turn`): the sampled entropy of each turn index.
docs/runs.md lists the fields; :func:`turns_text` is their part of the console line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from entrogym.agents.episode import Episode
from entrogym.agents.rollout import END_REASONS  # what the agent records as info["end_reason"]
from entrogym.algos.turns import turn_ids


def end_reason(episode: Episode) -> str:
    """What ended ``episode``: its ``info["end_reason"]`` where the agent recorded one, else
    read from its fields (an error; a cancellation; ``truncated_by``: ``context``, ``turn``
    for the turn budget, ``env`` or ``max_turns`` for a turn limit; for a truncation that names no
    limit, the last turn's finish reason, else the env's limit; otherwise ``done``)."""
    given = episode.info.get("end_reason")
    if given in END_REASONS:
        return str(given)
    if episode.failed:
        return "error"
    if episode.info.get("cancelled"):
        return "cancelled"
    cut = episode.info.get("truncated_by")
    if cut == "context":
        return "context"
    if cut == "turn":
        return "turn_budget"
    if cut in ("env", "max_turns"):
        return "max_turns"
    if episode.truncated:  # no word on the limit: the last turn's finish reason, else the env's
        last = (episode.info.get("finish_reasons") or [None])[-1]
        return {"context": "context", "turn": "turn_budget"}.get(last, "max_turns")
    return "done"


def _count(episodes: Sequence[Episode], key: str) -> int:
    """The sum of the episodes' ``info[key]`` totals (0 where absent)."""
    return sum(int(e.info.get(key) or 0) for e in episodes)


def episode_turn_metrics(episodes: Sequence[Episode], cancelled: int = 0) -> dict[str, Any]:
    """The per-turn fields of a row, over ``episodes`` (failed ones included) and
    ``cancelled`` more that early stopping cancelled and left out of them:

    ``turns_mean`` and ``turns_max`` (turns per episode), ``turns_hist`` (episodes by turn
    count), ``turns_cut`` (turns the per-turn token budget cut, whether or not that ended the
    episode), ``end_reasons`` (episodes by :func:`end_reason`, every reason present), the
    ``tool_calls`` and ``tool_errors`` their envs counted (``info`` totals: invalid calls,
    unknown tools, bad arguments, tools that raised), and ``reward_by_turns``: the mean
    reward of the episodes that ran (no env error) by turn count."""
    reasons = Counter(end_reason(e) for e in episodes)
    reasons["cancelled"] += cancelled
    turns = [e.num_turns for e in episodes]
    by_turns: dict[int, list[float]] = {}
    for e in episodes:
        if not e.failed:
            by_turns.setdefault(e.num_turns, []).append(float(e.reward))
    return {
        "turns_mean": sum(turns) / len(turns) if turns else None,
        "turns_max": max(turns, default=0),
        "turns_hist": {str(n): c for n, c in sorted(Counter(turns).items())},
        "turns_cut": sum((e.info.get("finish_reasons") or []).count("turn") for e in episodes),
        "end_reasons": {r: reasons.get(r, 0) for r in END_REASONS},
        "tool_calls": _count(episodes, "tool_calls"),
        "tool_errors": _count(episodes, "tool_errors"),
        "reward_by_turns": {str(n): sum(v) / len(v) for n, v in sorted(by_turns.items())},
    }


def entropy_by_turn(logprobs: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The sampled entropy of each turn index: for turn j (1, 2, ...), -mean log p over the
    action tokens of every row's j-th turn (its j-th run of ``mask``,
    :func:`~entrogym.algos.turns.turn_ids`), the estimate ``entropy`` is over all of them.
    Turn indices no row reached are left out."""
    ids = turn_ids(mask)
    out: dict[str, float] = {}
    for j in range(int(ids.max()) + 1 if ids.numel() else 0):
        at = ids == j
        if bool(at.any()):
            out[str(j + 1)] = float(-logprobs[at].double().mean())
    return out


def sampler_entropy_by_turn(episodes: Sequence[Episode]) -> dict[str, float]:
    """:func:`entropy_by_turn` of the engine's log-probs of the tokens it drew
    (``Episode.sampler_logprobs``), over the episodes that ran: for eval rows, which have no
    learner scores. Empty when none ran."""
    ran = [e for e in episodes if not e.failed and e.token_ids]
    if not ran:
        return {}
    mask = pad_sequence([torch.tensor(e.action_mask) for e in ran], batch_first=True)
    logprobs = [torch.tensor(e.sampler_logprobs, dtype=torch.float64) for e in ran]
    return entropy_by_turn(pad_sequence(logprobs, batch_first=True), mask)


def turns_text(row: dict[str, Any]) -> str:
    """The per-turn part of a console line, or "" where the episodes were single-turn and
    called no tools: `` turns=2.31 ended=done:10,max_turns:2 tool_errors=3/12``."""
    calls, errors = row.get("tool_calls") or 0, row.get("tool_errors") or 0
    if row.get("turns_mean") is None or ((row.get("turns_max") or 0) <= 1 and not calls + errors):
        return ""
    ended = ",".join(f"{r}:{n}" for r, n in (row.get("end_reasons") or {}).items() if n)
    tools = f" tool_errors={errors}/{calls}" if calls or errors else ""
    return f" turns={row['turns_mean']:.2f} ended={ended}{tools}"
