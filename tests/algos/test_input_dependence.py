"""The input-dependence estimators against answers known in closed form and against I(X; Y)
enumerated with numpy/scipy, on tabular policies whose responses are single tokens."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy

from entrogym.algos.input_dependence import (
    cross_pairs,
    cross_scores,
    first_turn,
    input_dependence,
    input_dependence_exact,
    input_dependence_per_token,
    retrieval_accuracy,
)
from tests.token_rows import episodes_batch


def _sample(table: np.ndarray, per_task: int, rng: np.random.Generator):
    """``per_task`` single-token responses of each task of the tabular policy ``table[n, V]``
    (rows are pi(.|x_i)) and their cross scores log pi(y_k | x_j), ``[n, n * per_task]``."""
    n, vocab = table.shape
    tasks = np.repeat(np.arange(n), per_task)
    tokens = np.array([rng.choice(vocab, p=table[i]) for i in tasks])
    with np.errstate(divide="ignore"):
        scores = np.log(table[:, tokens])
    return torch.from_numpy(scores), torch.from_numpy(tasks)


def _enumerated_mi(table: np.ndarray) -> float:
    """I(X; Y) for X uniform over the rows, by enumerating the joint p(x, y) = table / n:
    sum_{x,y} p(x, y) log(p(x, y) / (p(x) p(y)))."""
    n = len(table)
    joint = table / n
    marginal = joint.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = joint * np.log(joint / ((1.0 / n) * marginal[None, :]))
    return float(np.nansum(terms))


def test_responses_that_ignore_the_task_carry_no_information():
    rng = np.random.default_rng(0)
    row = rng.dirichlet(np.ones(7))
    table = np.tile(row, (5, 1))
    scores, tasks = _sample(table, 40, rng)
    assert input_dependence(scores, tasks) == pytest.approx(0.0, abs=1e-12)
    lengths = torch.ones(scores.shape[1])
    assert input_dependence_per_token(scores, lengths, tasks) == pytest.approx(0.0, abs=1e-12)
    assert input_dependence_exact(torch.from_numpy(np.log(table))) == pytest.approx(0, abs=1e-9)
    # every prompt ties: chance level
    assert retrieval_accuracy(scores, tasks) == pytest.approx(1 / 5)


def test_a_distinct_certain_response_per_task_carries_log_n():
    n = 6
    table = np.eye(n)
    scores, tasks = _sample(table, 3, np.random.default_rng(1))
    assert input_dependence(scores, tasks) == pytest.approx(math.log(n), abs=1e-12)
    with np.errstate(divide="ignore"):
        assert input_dependence_exact(torch.from_numpy(np.log(table))) == pytest.approx(
            math.log(n), abs=1e-9
        )
    assert retrieval_accuracy(scores, tasks) == 1.0


def test_the_exact_formula_matches_enumeration_and_scipys_entropies():
    rng = np.random.default_rng(2)
    for n, vocab in ((2, 3), (4, 10), (8, 5)):
        table = rng.dirichlet(np.full(vocab, 0.5), size=n)
        # H(Y) - H(Y|X) with scipy's entropies, and the joint's log-ratio sum: two routes
        by_entropies = scipy_entropy(table.mean(0)) - np.mean([scipy_entropy(r) for r in table])
        assert _enumerated_mi(table) == pytest.approx(by_entropies, abs=1e-12)
        got = input_dependence_exact(torch.from_numpy(np.log(table)))
        assert got == pytest.approx(by_entropies, abs=1e-9)
        assert 0 < got < math.log(n)


def test_the_monte_carlo_estimate_of_a_random_table_is_within_its_error_of_the_enumerated_mi():
    rng = np.random.default_rng(3)
    n, vocab, per_task = 5, 12, 4000
    table = rng.dirichlet(np.full(vocab, 0.3), size=n)
    exact = _enumerated_mi(table)
    scores, tasks = _sample(table, per_task, rng)
    estimate = input_dependence(scores, tasks)
    # the standard error of a mean over tasks of per-task means, from the per-response terms
    terms = (scores.gather(0, tasks[None])[0] - torch.logsumexp(scores, 0) + math.log(n)).numpy()
    per_task_var = np.array([terms[tasks.numpy() == i].var(ddof=1) for i in range(n)])
    se = math.sqrt(per_task_var.sum() / per_task) / n
    assert abs(estimate - exact) < 4 * se
    assert se < 0.01  # a tolerance tight enough to tell it from a biased estimate
    assert exact > 0.2  # the table does depend on its task


def test_each_task_weighs_the_same_however_many_responses_it_has():
    # task 0 always answers "a", task 1 "a" or "b" evenly: with task 1's responses in their
    # exact proportions the estimate is I exactly, whatever the counts per task
    table = np.array([[1.0, 0.0], [0.5, 0.5]])
    with np.errstate(divide="ignore"):
        logt = np.log(table)
    tokens, tasks = [0, 0, 1, 0, 1], [0, 1, 1, 1, 1]
    scores = torch.from_numpy(logt[:, tokens])
    exact = _enumerated_mi(table)
    assert input_dependence(scores, torch.tensor(tasks)) == pytest.approx(exact, abs=1e-12)
    # a plain mean over the five responses would weigh task 1 four times
    terms = scores.gather(0, torch.tensor([tasks]))[0] - torch.logsumexp(scores, 0) + math.log(2)
    assert float(terms.mean()) != pytest.approx(exact, abs=1e-2)


def test_the_per_token_variant_divides_each_response_by_its_length():
    scores = torch.tensor([[-2.0, -9.0, -4.0], [-6.0, -3.0, -8.0]])
    lengths = torch.tensor([2, 3, 4])
    tasks = torch.tensor([0, 1, 0])
    assert input_dependence_per_token(scores, lengths, tasks) == pytest.approx(
        input_dependence(scores / lengths[None, :].double(), tasks)
    )
    assert input_dependence_per_token(scores, lengths, tasks) != pytest.approx(
        input_dependence(scores, tasks)
    )
    assert input_dependence_per_token(scores, lengths, tasks) <= math.log(2)


@pytest.mark.parametrize(
    ("scores", "tasks", "message"),
    [
        (torch.tensor([[0.0, -1.0], [-1.0, float("nan")]]), [0, 1], "NaN"),
        (torch.tensor([[0.0, -1.0], [-1.0, -2.0]]), [0, 0], "every one of the 2 tasks"),
        (torch.tensor([[0.0, -1.0], [-1.0, -2.0]]), [0, 2], "0..1"),
        (torch.tensor([[0.0, -1.0], [-1.0, -2.0]]), [0], r"\[2\] integer"),
        (torch.tensor([[float("-inf"), -1.0], [-1.0, -2.0]]), [0, 1], "its own task"),
        (torch.zeros(3), [0, 1, 2], "2-D"),
    ],
)
def test_bad_scores_are_one_line_errors(scores, tasks, message):
    with pytest.raises(ValueError, match=message):
        input_dependence(scores, torch.tensor(tasks))


def test_the_exact_formula_refuses_rows_that_are_not_distributions():
    with pytest.raises(ValueError, match="log_softmax"):
        input_dependence_exact(torch.tensor([[0.0, 0.0], [-1.0, -1.0]]))


def test_cross_pairs_put_every_first_turn_after_every_tasks_prompt():
    batch = episodes_batch(
        [
            ([11, 12, 5, 6], [0, 0, 1, 1]),  # task 7: prompt 11 12, response 5 6
            ([11, 12, 8], [0, 0, 1]),  # task 7 again
            # task 3, two turns: prompt 21, response 9, env reply 30 31, response 4
            ([21, 9, 30, 31, 4], [0, 1, 0, 0, 1]),
            ([21, 2, 2, 2], [0, 1, 1, 1]),
        ],
        groups=[7, 7, 3, 3],
    )
    assert first_turn(batch.input_ids[2], batch.mask[2], 5) == (1, 2)
    pairs = cross_pairs(batch)
    # group ids are dense (3 -> 0, 7 -> 1): task 0's prompt is 21, task 1's is 11 12
    expected = [
        [21, 5, 6], [21, 8], [21, 9], [21, 2, 2, 2],
        [11, 12, 5, 6], [11, 12, 8], [11, 12, 9], [11, 12, 2, 2, 2],
    ]  # fmt: skip
    for i, row in enumerate(expected):
        n = int(pairs.lengths[i])
        assert pairs.input_ids[i, :n].tolist() == row
        prompt = len(row) - [2, 1, 1, 3][i % 4]
        assert pairs.mask[i, :n].tolist() == [0.0] * prompt + [1.0] * (n - prompt)
        assert int(pairs.attention_mask[i].sum()) == n
    assert pairs.group_ids.tolist() == [0] * 4 + [1] * 4
    scores, counts = cross_scores(-pairs.mask * torch.arange(1, 9)[:, None], pairs)
    assert scores.shape == (2, 4)
    assert scores[1, 0] == -5 * 2  # row 4: two response tokens, each -5
    assert counts.tolist() == [2, 1, 1, 3]


def test_a_row_without_action_tokens_is_refused():
    with pytest.raises(ValueError, match="no action tokens"):
        first_turn(torch.tensor([1, 2, 3]), torch.zeros(3), 3)
