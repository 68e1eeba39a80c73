"""Per-turn rewards -> per-token advantages of the right width (``--turn-rewards``).

Turns are the contiguous runs of the action mask; each action token gets the advantage of its
turn's return-to-go, compared at its turn index within its task group. Checked against
independent loops, the width contract of ``UpdateBatch`` and, without per-turn rewards, that
a batch is what it always was.
"""

from __future__ import annotations

import math

import pytest
import torch

from entrogym.algos import EntropyControl, UpdateBatch, get_algorithm, grpo, policy_update, rloo
from entrogym.algos.turns import (
    fold_turn_rewards,
    per_token_advantages,
    returns_to_go,
    turn_advantages,
    turn_counts,
    turn_ids,
)


def _runs(row: list[int]) -> list[list[int]]:
    """Positions of each contiguous run of 1s in ``row``, by a plain scan."""
    runs: list[list[int]] = []
    inside = False
    for t, m in enumerate(row):
        if m and not inside:
            runs.append([])
        if m:
            runs[-1].append(t)
        inside = bool(m)
    return runs


def _random_mask(g: torch.Generator, rows: int = 6, width: int = 14) -> torch.Tensor:
    mask = (torch.rand(rows, width, generator=g) < 0.55).float()
    mask[:, 1] = 1.0  # every row has at least one turn
    return mask


def test_turn_ids_number_the_runs_of_the_mask():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        mask = _random_mask(g)
        ids = turn_ids(mask)
        for i, row in enumerate(mask.long().tolist()):
            want = [-1] * len(row)
            for j, run in enumerate(_runs(row)):
                for t in run:
                    want[t] = j
            assert ids[i].tolist() == want
        assert turn_counts(mask).tolist() == [len(_runs(r)) for r in mask.long().tolist()]


def test_returns_to_go_sum_the_rewards_from_each_turn_on():
    rewards = torch.tensor([[0.1, 0.2, 0.7], [0.5, 9.0, 9.0], [0.0, 1.0, 0.0]])
    counts = torch.tensor([3, 1, 2])
    got = returns_to_go(rewards, counts)
    for i in range(3):
        n = int(counts[i])
        want = [sum(rewards[i, k].item() for k in range(j, n)) if j < n else 0.0 for j in range(3)]
        assert got[i].tolist() == pytest.approx(want)


def _by_hand(estimator: str, rewards, counts, groups) -> list[list[float]]:
    """Turn advantages computed with loops: for each (group, turn j), the returns-to-go of the
    rows that reached turn j, baselined as the estimator's formula says."""
    b, j_max = len(rewards), len(rewards[0])
    g_of = [
        [sum(rewards[i][k] for k in range(j, counts[i])) for j in range(j_max)] for i in range(b)
    ]
    out = [[0.0] * j_max for _ in range(b)]
    for group in set(groups):
        for j in range(j_max):
            rows = [i for i in range(b) if groups[i] == group and counts[i] > j]
            if len(rows) < 2:
                continue
            values = [g_of[i][j] for i in rows]
            k = len(values)
            mean = sum(values) / k
            for i in rows:
                if estimator == "rloo":
                    out[i][j] = g_of[i][j] - (sum(values) - g_of[i][j]) / (k - 1)
                else:
                    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1))
                    out[i][j] = (g_of[i][j] - mean) / (std + 1e-6)
    return out


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_turn_advantages_compare_returns_to_go_at_each_turn_index(estimator):
    g = torch.Generator().manual_seed(3)
    groups = [0, 0, 0, 1, 1, 1, 1, 2, 2]
    counts = [3, 1, 2, 4, 4, 2, 1, 2, 1]  # group 2's turn 1 is reached once: no comparison
    rewards = torch.rand(len(groups), 4, generator=g)
    got = turn_advantages(estimator, rewards, torch.tensor(counts), torch.tensor(groups))
    want = _by_hand(estimator, rewards.tolist(), counts, groups)
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-5, atol=1e-6)
    assert got[7, 1] == 0 and got[1, 1:].abs().sum() == 0  # lone and absent turns: 0
    # turn 0 is reached by every row: the terminal estimator on the returns
    terminal = {"grpo": grpo, "rloo": rloo}[estimator](
        returns_to_go(rewards, torch.tensor(counts))[:, 0], torch.tensor(groups)
    )
    torch.testing.assert_close(got[:, 0], terminal)


def test_each_action_token_gets_its_turns_advantage():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 0, 0, 0, 0, 0]]).float()
    per_turn = torch.tensor([[0.5, -2.0], [3.0, 0.0]])
    want = torch.tensor([[0, 0.5, 0.5, 0, -2.0, 0], [3.0, 0, 0, 0, 0, 0]])
    torch.testing.assert_close(per_token_advantages(per_turn, mask), want)
    with pytest.raises(ValueError, match="2 turns in a row, more than the 1"):
        per_token_advantages(per_turn[:, :1], mask)


def test_rewards_paid_after_the_last_run_belong_to_its_turn():
    assert fold_turn_rewards([0.1, 0.2, 0.3], 2) == pytest.approx([0.1, 0.5])
    assert fold_turn_rewards([0.1, 0.2], 2) == [0.1, 0.2]
    with pytest.raises(ValueError, match="1 per-turn rewards for 2 turns"):
        fold_turn_rewards([1.0], 2)


# ----- the update contract -------------------------------------------------------------------

MASK = torch.tensor(
    [[0, 1, 1, 0, 1, 1], [0, 1, 0, 1, 1, 0], [0, 1, 1, 1, 0, 0], [0, 1, 0, 1, 0, 1]]
).float()
GROUPS = torch.tensor([5, 5, 9, 9])


def test_per_token_advantages_must_have_the_masks_width():
    args = dict(rewards=torch.ones(4), group_ids=GROUPS, mask=MASK)
    with pytest.raises(ValueError, match=r"token_advantages shape \(4, 5\) must be \(4, 6\)"):
        UpdateBatch.build("grpo", **args, token_advantages=torch.zeros(4, 5))
    batch = UpdateBatch.build("grpo", **args, token_advantages=torch.zeros(4, 6))
    batch.old_logprobs = torch.zeros(4, 6)
    assert batch.rows(torch.tensor([0, 1])).advantages.shape == (2, 6)
    batch.token_advantages = torch.zeros(4, 3)  # set past build: rows() checks again
    with pytest.raises(ValueError, match="one advantage per token"):
        batch.rows(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"turn_rewards shape \(4, 2\) must be \(4, 3\)"):
        UpdateBatch.build("grpo", **args, turn_rewards=torch.zeros(4, 2))


def test_turn_rewards_give_per_token_advantages_beside_the_trajectory_ones():
    turn_rewards = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0, 0], [0.2, 0, 0], [0.0, 0.0, 0.0]])
    batch = UpdateBatch.build(
        "grpo", rewards=turn_rewards.sum(1), group_ids=GROUPS, mask=MASK, turn_rewards=turn_rewards
    )
    torch.testing.assert_close(batch.advantages, grpo(turn_rewards.sum(1), GROUPS))
    per_turn = turn_advantages("grpo", turn_rewards, turn_counts(MASK), GROUPS)
    torch.testing.assert_close(batch.token_advantages, per_token_advantages(per_turn, MASK))
    assert batch.token_advantages.shape == MASK.shape
    assert bool((batch.token_advantages[MASK == 0] == 0).all())
    batch.old_logprobs = torch.zeros(4, 6)
    rows = batch.rows(torch.tensor([1, 3]))  # cut to the rows' width, like every tensor
    torch.testing.assert_close(rows.advantages, batch.token_advantages[[1, 3], :6])


def test_without_turn_rewards_a_batch_is_what_it_was():
    batch = UpdateBatch.build("rloo", rewards=torch.tensor([1.0, 0, 0.5, 0.2]), group_ids=GROUPS,
                              mask=MASK, old_logprobs=torch.zeros(4, 6))  # fmt: skip
    assert batch.turn_rewards is None and batch.token_advantages is None
    rows = batch.rows(torch.tensor([0, 2]))
    assert rows.advantages.shape == (2,)  # one advantage per trajectory, as before
    assert torch.equal(rows.advantages, batch.advantages[[0, 2]])
    assert torch.equal(batch.trajectory_signal(), batch.advantages)


def _scorer(weights: torch.nn.Parameter):
    """Log-probs of the sampled tokens from one free logit per position (a toy policy)."""

    def score(index, need_entropy):
        lp = torch.nn.functional.logsigmoid(weights[index])
        return lp, (torch.ones_like(lp) if need_entropy else None)

    return score


def _update(batch: UpdateBatch, algo: str = "grpo"):
    """One policy update of the toy policy on ``batch``; its gradients and metrics."""
    weights = torch.nn.Parameter(torch.linspace(-1.0, 2.0, 24).reshape(4, 6))
    grads = []

    def step():
        grads.append(weights.grad.clone())
        return True

    metrics = policy_update(
        EntropyControl(get_algorithm(algo)),
        batch,
        score=_scorer(weights),
        backward=torch.Tensor.backward,
        step=step,
        zero_grad=lambda: setattr(weights, "grad", None),
        micro_batch_size=2,
        generator=torch.Generator().manual_seed(0),
    )
    return grads, metrics


def test_one_turn_with_a_terminal_reward_updates_exactly_as_the_terminal_path():
    mask = torch.tensor([[0, 1, 1, 1, 0, 0]] * 2 + [[0, 0, 1, 1, 1, 1]] * 2).float()
    rewards = torch.tensor([1.0, 0.0, 0.25, 0.75])
    old = torch.full((4, 6), -0.7)
    common = dict(rewards=rewards, group_ids=GROUPS, mask=mask)
    terminal = UpdateBatch.build("grpo", **common, old_logprobs=old.clone())
    turns = UpdateBatch.build("grpo", **common, old_logprobs=old.clone(),
                              turn_rewards=rewards[:, None])  # fmt: skip
    (g_terminal, m_terminal), (g_turns, m_turns) = _update(terminal), _update(turns)
    assert len(g_terminal) == len(g_turns) >= 1
    for a, b in zip(g_terminal, g_turns, strict=True):
        assert torch.equal(a, b)
    assert m_terminal == m_turns


def test_the_loss_trains_on_the_per_token_advantages():
    """Rows 0 and 1 (one task) both return 1, row 0 paid at its first turn and row 1 at its
    second: one advantage per trajectory has no signal, the per-token ones push their second
    turns apart. Group 9's turns compare equal returns: no signal there."""
    turn_rewards = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0.5, 0, 0], [0, 0.5, 0]])
    # on-policy (the update scores the old log-probs): no token is clipped
    batch = UpdateBatch.build("grpo", rewards=turn_rewards.sum(1), group_ids=GROUPS, mask=MASK,
                              turn_rewards=turn_rewards)  # fmt: skip
    assert bool((batch.advantages == 0).all())
    grads, metrics = _update(batch)
    assert metrics["zero_adv_groups"] == 1
    advantages = batch.token_advantages
    moved = (MASK > 0) & (advantages != 0)
    assert moved.nonzero()[:, 0].unique().tolist() == [0, 1]  # the second turns of rows 0, 1
    assert float(advantages[0, 4]) < 0 < float(advantages[1, 3])
    # gradient descent on the loss raises a token's log-prob where its advantage is positive
    assert bool((torch.sign(grads[0][moved]) == -torch.sign(advantages[moved])).all())
    assert bool((grads[0][~moved] == 0).all())
