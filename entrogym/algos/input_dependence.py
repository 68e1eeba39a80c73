"""Input dependence: how much a policy's responses depend on its task, as the mutual information
I(X; Y) between a task X drawn uniformly from n probe tasks and the response Y the policy
samples for it, in nats (one function per formula).

I(X; Y) = H(Y) - H(Y | X): the entropy of the responses pooled over the tasks minus the mean
entropy of the responses within a task (Cover & Thomas, "Elements of Information Theory", 2nd
ed., 2006, Sec. 2.4). Token entropy, what the entropy controllers track, measures only the
within-task part. A policy can keep it high while its responses stop depending on the task;
Wang et al. 2026 ("RAGEN-2: Reasoning Collapse in Agentic RL", arXiv:2604.06268) call this
"template collapse" and diagnose it by scoring every sampled response under every prompt of a
batch, which shows it as I(X; Y) falling to 0 while the entropy stays where it was.

For sequences the entropies cannot be enumerated; :func:`input_dependence` estimates I from
sampled responses and their log-probs under every probe prompt (:func:`cross_pairs` builds the
rows to score, :func:`cross_scores` sums them).
"""

from __future__ import annotations

import math

import torch

from entrogym.algos.update_batch import UpdateBatch


def input_dependence_exact(conditional_logprobs: torch.Tensor) -> float:
    """I(X; Y) = H(mean_i pi(.|x_i)) - mean_i H(pi(.|x_i)) for X uniform over the n rows of
    ``conditional_logprobs[n, V]`` = log pi(y|x_i) over a finite response set of size V (Cover &
    Thomas 2006, Sec. 2.4: the pooled entropy minus the mean entropy within a task).

    For policies whose responses can be enumerated (the bandit lab's, single tokens). Each row
    must be a distribution (its probabilities sum to 1); -inf marks a response the task never
    gets. 0 when every row is the same distribution, log n when the rows have disjoint supports.
    """
    logp = _check_scores("conditional_logprobs", conditional_logprobs).double()
    if not torch.allclose(torch.logsumexp(logp, dim=1), torch.zeros(len(logp)).double(), atol=1e-5):
        raise ValueError(
            "conditional_logprobs: each row must be a distribution (log-probs whose "
            "probabilities sum to 1); apply log_softmax to logits first"
        )
    probs = logp.exp()
    within = -torch.where(probs > 0, probs * logp, 0.0).sum(dim=1)
    pooled = probs.mean(dim=0)
    pooled_entropy = -torch.where(pooled > 0, pooled * pooled.log(), 0.0).sum()
    return float(pooled_entropy - within.mean())


def input_dependence(scores: torch.Tensor, tasks: torch.Tensor) -> float:
    """Monte Carlo estimate of I(X; Y) for X uniform over n probe tasks, from responses y_k
    sampled by the policy for task ``tasks[k]`` and ``scores[j, k]`` = log pi(y_k | x_j), the
    log-prob of each response under every task's prompt (``[n, N]``).

    I(X; Y) = E_{x_i, y ~ pi(.|x_i)}[log pi(y|x_i) - log p(y)] with the marginal p(y) =
    (1/n) sum_j pi(y|x_j) (the definition of I as the expected log-ratio of conditional to
    marginal, Cover & Thomas 2006, Sec. 2.3). The marginal is summed over the n tasks exactly,
    so the mean of the per-response terms is unbiased for I on these tasks; each task weighs
    1/n however many of its responses came back. Every term is at most log n, so the estimate is
    too. The score matrix is RAGEN-2's in-batch cross-scoring (Wang et al. 2026), there read
    as proxies of I (retrieval accuracy, :func:`retrieval_accuracy`, and z-scored scores);
    this is the estimate of I itself, in nats per response.

    ``-inf`` in ``scores`` marks a response another task's prompt can never give; a response's
    score under its own task must be finite (it was sampled there). Every task 0..n-1 needs a
    response.
    """
    scores = _check_scores("scores", scores)
    tasks = _check_tasks(tasks, scores)
    own = scores.gather(0, tasks[None, :])[0]
    if not bool(torch.isfinite(own).all()):
        raise ValueError(
            "scores: a response has log-prob -inf under its own task's prompt, where it was "
            "sampled; score each response under the prompt that produced it"
        )
    n = scores.shape[0]
    terms = own - torch.logsumexp(scores, dim=0) + math.log(n)
    return _task_mean(terms, tasks, n)


def input_dependence_per_token(
    scores: torch.Tensor, response_lengths: torch.Tensor, tasks: torch.Tensor
) -> float:
    """:func:`input_dependence` on length-normalised scores: ``scores[j, k] / response_lengths[k]``,
    each response's mean log-prob per token under each prompt. The normalisation is entrogym's
    choice, so that long responses do not dominate; the estimator it feeds is
    :func:`input_dependence`'s (Cover & Thomas 2006, Sec. 2.3).

    A proxy in nats per token, not an information of the policy in general: like I it is 0 when
    the responses do not depend on the task and at most log n, and it equals
    :func:`input_dependence` for one-token responses; a long response no longer outweighs the
    others, as it does in the sequence estimate (whose terms grow with the tokens that differ).
    Computed from the same score matrix, so it costs nothing more.
    """
    lengths = torch.as_tensor(response_lengths)
    if lengths.shape != (scores.shape[1],) or not bool((lengths > 0).all()):
        raise ValueError(
            f"response_lengths must be [{scores.shape[1]}] positive token counts, one per "
            "response (column of scores)"
        )
    return input_dependence(scores / lengths.to(scores.dtype)[None, :], tasks)


def retrieval_accuracy(scores: torch.Tensor, tasks: torch.Tensor) -> float:
    """The share of responses whose own task's prompt scores them highest among the n prompts
    (RAGEN-2's retrieval accuracy, Wang et al. 2026), each task weighing 1/n; a tie
    counts as the share of the tied prompts that are its own, so input-independent responses
    score 1/n exactly, the chance level, and responses that name their task score 1."""
    scores = _check_scores("scores", scores)
    tasks = _check_tasks(tasks, scores)
    top = scores == scores.max(dim=0).values[None, :]
    own_on_top = top.gather(0, tasks[None, :])[0].to(torch.float64)
    return _task_mean(own_on_top / top.sum(dim=0), tasks, scores.shape[0])


def _check_scores(name: str, scores: torch.Tensor) -> torch.Tensor:
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or 0 in scores.shape:
        raise ValueError(f"{name} must be a non-empty 2-D tensor [tasks, responses]")
    scores = scores if scores.is_floating_point() else scores.double()
    if bool(torch.isnan(scores).any()) or bool((scores == math.inf).any()):
        raise ValueError(f"{name} contains NaN or +inf; log-probs are finite or -inf")
    return scores


def _check_tasks(tasks: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    tasks = torch.as_tensor(tasks)
    n, responses = scores.shape
    if tasks.shape != (responses,) or tasks.is_floating_point():
        raise ValueError(f"tasks must be [{responses}] integer task indices, one per response")
    tasks = tasks.long()
    if bool((tasks < 0).any()) or bool((tasks >= n).any()):
        raise ValueError(f"tasks must lie in 0..{n - 1} (one row of scores per task)")
    if len(torch.unique(tasks)) != n:
        raise ValueError(
            f"every one of the {n} tasks needs a sampled response; drop the tasks without one "
            "from the scores' rows"
        )
    return tasks


def _task_mean(values: torch.Tensor, tasks: torch.Tensor, n: int) -> float:
    """Mean over tasks of each task's mean value: X is uniform over the tasks."""
    values = values.double()
    sums = torch.zeros(n, dtype=torch.float64).index_add_(0, tasks, values)
    counts = torch.bincount(tasks, minlength=n).double()
    return float((sums / counts).mean())


# ----- the rows to score ------------------------------------------------------------------------


def first_turn(input_ids: torch.Tensor, mask: torch.Tensor, length: int) -> tuple[int, int]:
    """Where one row's first response lies: ``(start, end)`` of the first run of action tokens
    (``mask > 0``) in its first ``length`` tokens. Before ``start`` is the prompt the policy
    answered; a multi-turn episode's later turns depend on the env's replies, so its task's
    response is its first turn."""
    acting = (mask[:length] > 0).nonzero().flatten()
    if len(acting) == 0:
        raise ValueError("a row has no action tokens; drop it before scoring input dependence")
    start = int(acting[0])
    gaps = (mask[start:length] <= 0).nonzero().flatten()
    end = start + int(gaps[0]) if len(gaps) else length
    return start, end


def cross_pairs(batch: UpdateBatch, pad_id: int = 0) -> UpdateBatch:
    """Every response of ``batch`` after every task's prompt, to score log pi(y_k | x_j).

    ``batch``: sampled episodes of n tasks (``group_ids`` 0..n-1, its dense task index). The
    prompt x_j of task j is the part of its first row before the first action token; the
    response y_k of row k is its first turn (:func:`first_turn`). Row ``j * N + k`` of the
    returned batch (N = ``len(batch)``) holds x_j followed by y_k, with ``mask`` 1 on y_k's
    tokens and ``group_ids`` j: :func:`cross_scores` reads it back into ``[n, N]``. Token ids
    are concatenated, not re-tokenised, so the row with j = k's task holds exactly the tokens
    the policy saw when it sampled y_k (the whole row for a single-turn episode).
    """
    if batch.input_ids is None:
        raise ValueError("cross_pairs needs token ids (collate_episodes makes them)")
    n = batch.n_groups
    turns = [first_turn(batch.input_ids[k], batch.mask[k], int(batch.lengths[k]))
             for k in range(len(batch))]  # fmt: skip
    responses = [batch.input_ids[k, s:e] for k, (s, e) in enumerate(turns)]
    firsts = [int((batch.group_ids == j).nonzero()[0]) for j in range(n)]
    prompts = [batch.input_ids[k, : turns[k][0]] for k in firsts]
    rows = [(prompt, response) for prompt in prompts for response in responses]
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width))
    lengths = torch.zeros(len(rows), dtype=torch.long)
    for i, (prompt, response) in enumerate(rows):
        p, r = len(prompt), len(response)
        ids[i, :p], ids[i, p : p + r] = prompt, response
        mask[i, p : p + r] = 1.0
        lengths[i] = p + r
    attention = (torch.arange(width)[None, :] < lengths[:, None]).long()
    groups = torch.arange(n).repeat_interleave(len(batch))
    return UpdateBatch.build(None, rewards=torch.zeros(len(rows)), group_ids=groups, mask=mask,
                             lengths=lengths, input_ids=ids, attention_mask=attention)  # fmt: skip


def cross_scores(logprobs: torch.Tensor, pairs: UpdateBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[n, N]`` scores log pi(y_k | x_j) of :func:`cross_pairs`'s rows from their per-token
    log-probs ``logprobs`` (``[n * N, T]`` like ``pairs.mask``), and the N responses' token
    counts (for :func:`input_dependence_per_token`)."""
    if logprobs.shape != pairs.mask.shape:
        raise ValueError(
            f"logprobs must have the shape of the pairs' mask {tuple(pairs.mask.shape)}"
        )
    n = pairs.n_groups
    sums = (logprobs.double() * pairs.mask).sum(dim=1).reshape(n, -1)
    counts = pairs.mask.sum(dim=1).reshape(n, -1)[0].long()
    return sums, counts
