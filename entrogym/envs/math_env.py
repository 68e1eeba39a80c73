"""Single-turn competition math (AIME, AMC): answer in ``\\boxed{}``, reward 1 if correct."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from entrogym.envs.base import DEFAULT_MAX_CHARS, TextEnv, Turn
from entrogym.envs.datasets import Problem, default_split, load_problems

DEFAULT_PROMPT = (
    "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."
)


def check_prompt_template(template: str) -> str:
    """``template`` if it formats with a ``problem`` field; ValueError saying what is wrong."""
    if not isinstance(template, str) or "{problem}" not in template:
        raise ValueError(
            "prompt_template must be a str containing '{problem}' (write literal braces as "
            f"'{{{{' and '}}}}'), got {template!r}"
        )
    try:
        template.format(problem="x")
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"prompt_template {template!r} does not format with only 'problem': {e!r}; "
            "write literal braces as '{{' and '}}'"
        ) from e
    return template


class MathEnv(TextEnv):
    """One problem per episode; the action is the full response, graded by
    :func:`entrogym.envs.grading.grade` against the reference answer.

    Args:
        dataset: a shipped dataset (``aime_2024``, ``aime_2025``, ``amc_2023``,
            ``aime_1983_2023``) or a path to a ``.jsonl`` file of ``{id, problem, answer}``.
        split: the split its problems form (``test`` for the evaluation sets, ``train`` for
            AIME 1983-2023 and user files); the only split this env has.
        max_response_tokens: the response budget (the paper's 4096). The agent enforces it and
            calls ``flag_action_truncated()`` when it cut a response; reset's info carries it.
        prompt_template: a ``str.format`` template with a ``{problem}`` field.
        grading_timeout: seconds allowed to the sympy stage of grading.
    """

    def __init__(
        self,
        dataset: str | Path = "aime_2024",
        *,
        split: str | None = None,
        max_response_tokens: int = 4096,
        prompt_template: str = DEFAULT_PROMPT,
        grading_timeout: float = 5.0,
        max_action_chars: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        if not isinstance(max_response_tokens, int) or max_response_tokens < 1:
            raise ValueError(
                f"max_response_tokens must be a positive integer, got {max_response_tokens!r}"
            )
        if not isinstance(grading_timeout, int | float) or not grading_timeout > 0:
            raise ValueError(f"grading_timeout must be > 0 seconds, got {grading_timeout!r}")
        self.prompt_template = check_prompt_template(prompt_template)
        self.dataset = dataset
        self._split_name = default_split(dataset)
        if split is not None and split != self._split_name:
            raise ValueError(
                f"dataset {str(dataset)!r} has only the split {self._split_name!r}, got {split!r}"
            )
        self._problems: dict[str, Problem] = {p.id: p for p in load_problems(dataset)}
        if not self._problems:
            raise ValueError(f"dataset {str(dataset)!r} has no problems")
        self.max_response_tokens = max_response_tokens
        self.grading_timeout = float(grading_timeout)
        # Tokens are several characters; 32 per token covers any tokenizer's longest pieces.
        bound = max_action_chars or max(DEFAULT_MAX_CHARS, 32 * max_response_tokens)
        super().__init__(
            split=self._split_name, max_turns=1, max_action_chars=bound, render_mode=render_mode
        )

    @property
    def splits(self) -> tuple[str, ...]:
        return (self._split_name,)

    def task_ids(self, split: str | None = None) -> list[str]:
        self.resolve_split(split)
        return list(self._problems)

    def has_task(self, task_id: str) -> bool:
        return task_id in self._problems

    def reference(self, task_id: str) -> str:
        """The reference answer of ``task_id``."""
        return self._problems[task_id].answer

    def _start_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        from entrogym.envs.grading import prestart

        prestart()  # the grading worker starts while the answer is generated
        problem = self._problems[task_id]
        prompt = self.prompt_template.format(problem=problem.problem)
        return prompt, {"max_response_tokens": self.max_response_tokens}

    def _respond(self, action: str) -> Turn:
        from entrogym.envs.grading import grade  # lazy: sympy/lm-eval only once grading starts

        assert self._task_id is not None
        reference = self._problems[self._task_id].answer
        result = grade(action, reference, self.grading_timeout)
        return Turn(
            observation="",
            done=True,
            reward=1.0 if result.correct else 0.0,
            success=result.correct,
            reward_parts={"correct": 1.0 if result.correct else 0.0},
            info={
                "extracted_answer": result.extracted,
                "reference": reference,
                "grade_method": result.method,
                "grade_timed_out": result.timed_out,
            },
        )
