"""The scores of an evaluation, as pure functions: the unbiased pass@k estimator, the ks it is
reported at, and the number of distinct correct answers of a task.

:mod:`entrogym.train.evaluation.evaluate` applies them to the episodes it rolled out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from math import comb
from typing import Any

# pass@k is reported on a log-spaced k grid up to the samples per task (and at the samples)
REPORTED_KS = (1, 4, 16, 64)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: 1 - C(n-c, k) / C(n, k)
    (Chen et al., 2021, "Evaluating Large Language Models Trained on Code", eq. 1)."""
    if not (0 <= c <= n) or n < 1:
        raise ValueError(f"pass_at_k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n (samples per task), got k={k}, n={n}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(correct: Mapping[str, Sequence[bool]], k: int) -> float:
    """pass@k averaged over tasks; ``correct[task]`` holds one bool per sample. A task with
    fewer than ``k`` samples (early-stopped) counts with k = its sample count."""
    scored = {t: v for t, v in correct.items() if v}
    if not scored:
        raise ValueError("mean_pass_at_k needs at least one task with a sample")
    return sum(pass_at_k(len(v), sum(map(bool, v)), min(k, len(v))) for v in scored.values()) / len(
        scored
    )


def pass_at_ks(samples: int, extra: Iterable[int] = ()) -> list[int]:
    """The ks pass@k is reported at for ``samples`` samples per task, ascending: those of
    :data:`REPORTED_KS` up to ``samples``, ``samples`` itself, and ``extra``. A k of ``extra``
    outside 1..samples is a ValueError (pass@k needs k of the samples)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    extra = list(extra)
    bad = [
        k for k in extra if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= samples
    ]
    if bad:
        raise ValueError(
            f"pass@k needs 1 <= k <= the samples per task ({samples}), got k={bad[0]!r}; "
            "ask for a smaller k or take more samples"
        )
    return sorted({*(k for k in REPORTED_KS if k <= samples), samples, *extra})


def final_answer(info: Mapping[str, Any]) -> str:
    """An episode's final answer, from its ``info``: the env's ``extracted_answer`` when it
    gives one as text (the math, Arithmetic and reasoning-gym envs do), else the last action's
    text, else ""; whitespace runs become one space, so spacing alone never makes two answers."""
    answer = info.get("extracted_answer")
    if not isinstance(answer, str):
        actions = info.get("actions") or [""]
        answer = str(actions[-1])
    return " ".join(answer.split())


def distinct_correct(answers: Iterable[str]) -> int:
    """How many different answers the correct samples of one task gave (``answers``: their
    :func:`final_answer`). Two spellings of one value ("1/2", "0.5") count as two."""
    return len(set(answers))
