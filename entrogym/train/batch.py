"""Episodes -> one right-padded ``UpdateBatch`` (the collate step): the one experience type the
trainer scores and ``entrogym.algos.policy_update`` trains on."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from entrogym.agents.episode import Episode
from entrogym.algos.turns import fold_turn_rewards, turn_counts
from entrogym.algos.update_batch import UpdateBatch


def collate_episodes(
    episodes: Sequence[Episode], pad_token_id: int = 0, turn_rewards: bool = False
) -> UpdateBatch:
    """Right-pad ``episodes`` into one ``UpdateBatch`` (rows in the episodes' order; its
    advantages are computed by the trainer, which knows the algorithm). A row's weight version
    is ``Episode.info["policy_version"]`` (0 where absent). ``turn_rewards``: also the batch's
    per-turn rewards, from each episode's ``info["turn_rewards"]`` (rollouts collected with
    ``turn_rewards``), one per turn of its action tokens (:func:`per_turn_rewards`)."""
    if not episodes:
        raise ValueError("episodes is empty; collect rollouts first")
    for ep in episodes:
        if not isinstance(ep, Episode):
            raise ValueError(f"collate_episodes takes Episodes, got {type(ep).__name__}")
        if not ep.token_ids:
            raise ValueError(f"episode {ep.task_id!r} has no tokens")
    n, t = len(episodes), max(len(e.token_ids) for e in episodes)
    input_ids = torch.full((n, t), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, t), dtype=torch.long)
    action_mask = torch.zeros((n, t), dtype=torch.float32)
    sampler_logprobs = torch.zeros((n, t), dtype=torch.float32)
    for i, ep in enumerate(episodes):
        k = len(ep.token_ids)
        input_ids[i, :k] = torch.tensor(ep.token_ids, dtype=torch.long)
        attention_mask[i, :k] = 1
        action_mask[i, :k] = torch.tensor(ep.action_mask, dtype=torch.float32)
        sampler_logprobs[i, :k] = torch.tensor(ep.sampler_logprobs, dtype=torch.float32)
    per_turn = per_turn_rewards(episodes, action_mask) if turn_rewards else None
    return UpdateBatch.build(
        None,
        turn_rewards=per_turn,
        rewards=torch.tensor([float(e.reward) for e in episodes], dtype=torch.float32),
        group_ids=torch.tensor([e.group_id for e in episodes], dtype=torch.long),
        mask=action_mask,
        lengths=torch.tensor([len(e.token_ids) for e in episodes], dtype=torch.long),
        input_ids=input_ids,
        attention_mask=attention_mask,
        sampler_logprobs=sampler_logprobs * action_mask,
        versions=torch.tensor(
            [int(e.info.get("policy_version", 0)) for e in episodes], dtype=torch.long
        ),
    )


def per_turn_rewards(episodes: Sequence[Episode], action_mask: torch.Tensor) -> torch.Tensor:
    """``[B, J]``: what each turn of each episode was paid, J the most turns of one; a turn is
    a contiguous run of the row's ``action_mask`` (:func:`~entrogym.algos.turns.turn_ids`),
    and rewards paid after its last run count for that run's turn."""
    counts = turn_counts(action_mask).tolist()
    out = torch.zeros((len(episodes), max(counts)), dtype=torch.float32)
    for i, (ep, n) in enumerate(zip(episodes, counts, strict=True)):
        paid = ep.info.get("turn_rewards")
        if not isinstance(paid, list):
            raise ValueError(
                f"episode {ep.task_id!r} has no info['turn_rewards']; collect rollouts with "
                "turn_rewards=True to train on per-turn rewards"
            )
        out[i, :n] = torch.tensor(fold_turn_rewards(paid, n), dtype=torch.float32)
    return out


def usable_episodes(episodes: list[Episode]) -> list[Episode]:
    """Episodes that can enter the loss: with action tokens, in groups of at least two."""
    with_actions = [e for e in episodes if e.num_action_tokens > 0]
    sizes: dict[int, int] = {}
    for e in with_actions:
        sizes[e.group_id] = sizes.get(e.group_id, 0) + 1
    return [e for e in with_actions if sizes[e.group_id] >= 2]


def is_success(episode: Episode) -> bool:
    """Whether ``episode`` solved its task: ``info["success"]``, else a reward >= 1."""
    return bool(episode.info.get("success", episode.reward >= 1.0))


def success_rate(episodes: list[Episode]) -> float:
    """Share of episodes that solved their task (:func:`is_success`)."""
    return sum(is_success(e) for e in episodes) / len(episodes)
