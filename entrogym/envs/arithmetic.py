"""Procedurally generated arithmetic: the CPU-sized task on which a 135M model's reward moves.

A task set is a pure function of the constructor's knobs and ``task_seed``: the same arguments
give the same problems on any machine. The ``test`` split is disjoint from ``train``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from entrogym.envs.base import TextEnv, Turn
from entrogym.envs.math_env import check_prompt_template

DEFAULT_PROMPT = "What is {problem}? Put the final answer in \\boxed{{}}."
_OPERATIONS = frozenset("+-*")
_SPLIT_CODES = {"train": 0, "test": 1}


@dataclass(frozen=True)
class ArithmeticProblem:
    expression: str
    answer: int


def evaluate(operands: list[int], ops: list[str]) -> int:
    """Value of ``operands[0] ops[0] operands[1] ...`` with ``*`` binding tighter than ``+ -``."""
    terms, signs, current = [], [1], operands[0]
    for op, x in zip(ops, operands[1:], strict=True):
        if op == "*":
            current *= x
        else:
            terms.append(current)
            signs.append(1 if op == "+" else -1)
            current = x
    terms.append(current)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


class ArithmeticEnv(TextEnv):
    """``What is 37 + 58?`` -- reward 1 for the right integer, boxed or as the last number.

    Args:
        task_seed: seed of the task set (not of ``reset``, which only picks among tasks).
        num_operands: operands per expression (>= 2).
        min_digits, max_digits: each operand has a digit count drawn from this range.
        operations: the operators to draw from, a subset of ``"+-*"``.
        allow_negative: if False, expressions with a negative value are redrawn.
        negative_only: only expressions with a negative value are kept (needs
            ``allow_negative``); with ``absolute``, every task is one the signed habit gets wrong.
        absolute: the task is the expression's absolute value, written ``|3 - 7|`` (answer 4).
            With ``allow_negative`` it is a task switch after the signed one: the same operands
            and operators, and on every negative value the signed habit's answer is wrong.
        num_train, num_test: tasks in the ``train`` and ``test`` splits.
        split: the split ``reset`` draws from without a ``task_id``.
        prompt_template: ``str.format`` template with a ``{problem}`` field.
        grading_timeout: seconds allowed to the grader's sympy stage.

    The defaults (2 operands of 1-2 digits, + and -) are sized so that SmolLM2-135M-Instruct
    solves some but not all tasks, which is what makes the reward signal informative.
    """

    def __init__(
        self,
        *,
        task_seed: int = 0,
        num_operands: int = 2,
        min_digits: int = 1,
        max_digits: int = 2,
        operations: str = "+-",
        allow_negative: bool = False,
        negative_only: bool = False,
        absolute: bool = False,
        num_train: int = 1000,
        num_test: int = 200,
        split: str = "train",
        prompt_template: str = DEFAULT_PROMPT,
        grading_timeout: float = 5.0,
        render_mode: str | None = None,
    ) -> None:
        _check_int("task_seed", task_seed, 0)
        _check_int("num_operands", num_operands, 2)
        _check_int("min_digits", min_digits, 1)
        _check_int("max_digits", max_digits, min_digits)
        _check_int("num_train", num_train, 0)
        _check_int("num_test", num_test, 0)
        if not operations or not set(operations) <= _OPERATIONS:
            raise ValueError(f"operations must be a non-empty subset of '+-*', got {operations!r}")
        for name, flag in (("negative_only", negative_only), ("absolute", absolute)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be true or false, got {flag!r}")
        if negative_only and not allow_negative:
            raise ValueError("negative_only keeps negative values only: set allow_negative true")
        if not isinstance(grading_timeout, int | float) or not grading_timeout > 0:
            raise ValueError(f"grading_timeout must be > 0 seconds, got {grading_timeout!r}")
        self.prompt_template = check_prompt_template(prompt_template)
        self.task_seed, self.num_operands = task_seed, num_operands
        self.min_digits, self.max_digits = min_digits, max_digits
        self.operations, self.allow_negative = "".join(sorted(set(operations))), allow_negative
        self.negative_only, self.absolute = negative_only, absolute
        self.grading_timeout = float(grading_timeout)
        self._tasks: dict[str, dict[str, ArithmeticProblem]] = self._generate(num_train, num_test)
        super().__init__(split=split, max_turns=1, render_mode=render_mode)
        self.resolve_split(split)

    # ----- task set ----------------------------------------------------------------------

    def _draw(self, rng: np.random.Generator) -> ArithmeticProblem:
        while True:
            operands = []
            for _ in range(self.num_operands):
                digits = int(rng.integers(self.min_digits, self.max_digits + 1))
                low = 0 if digits == 1 else 10 ** (digits - 1)
                operands.append(int(rng.integers(low, 10**digits)))
            ops = [str(rng.choice(list(self.operations))) for _ in range(self.num_operands - 1)]
            value = evaluate(operands, ops)
            if (self.allow_negative or value >= 0) and (value < 0 or not self.negative_only):
                text = " ".join(
                    [str(operands[0])]
                    + [f"{o} {x}" for o, x in zip(ops, operands[1:], strict=True)]
                )
                if self.absolute:
                    return ArithmeticProblem(f"|{text}|", abs(value))
                return ArithmeticProblem(text, value)

    def _generate(self, num_train: int, num_test: int) -> dict[str, dict[str, ArithmeticProblem]]:
        seen: set[str] = set()
        tasks: dict[str, dict[str, ArithmeticProblem]] = {}
        for split, count in (("train", num_train), ("test", num_test)):
            rng = np.random.default_rng([self.task_seed, _SPLIT_CODES[split]])
            problems: dict[str, ArithmeticProblem] = {}
            attempts = 0
            while len(problems) < count:
                attempts += 1
                if attempts > 50 * (count + 10):
                    raise ValueError(
                        f"cannot draw {count} distinct {split} problems with {self.num_operands} "
                        f"operands of {self.min_digits}-{self.max_digits} digits and operations "
                        f"{self.operations!r}; lower num_train/num_test or widen the digits"
                    )
                problem = self._draw(rng)
                if problem.expression in seen:
                    continue
                seen.add(problem.expression)
                problems[f"{split}-{len(problems):05d}"] = problem
            tasks[split] = problems
        return tasks

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def task_ids(self, split: str | None = None) -> list[str]:
        name = self.resolve_split(split)
        ids = list(self._tasks[name])
        if not ids:
            raise ValueError(
                f"split {name!r} has no tasks (num_{name}=0); set num_{name} > 0 or use another split"
            )
        return ids

    def has_task(self, task_id: str) -> bool:
        return any(task_id in tasks for tasks in self._tasks.values())

    def problem(self, task_id: str) -> ArithmeticProblem:
        """The expression and integer answer of ``task_id``."""
        for tasks in self._tasks.values():
            if task_id in tasks:
                return tasks[task_id]
        raise ValueError(f"unknown task_id {task_id!r}; list the valid ones with task_ids(split)")

    # ----- episode -----------------------------------------------------------------------

    def _start_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        from entrogym.envs.grading import prestart

        prestart()  # the grading worker starts while the answer is generated
        return self.prompt_template.format(problem=self.problem(task_id).expression), {}

    def _respond(self, action: str) -> Turn:
        from entrogym.envs.grading import grade

        assert self._task_id is not None
        reference = str(self.problem(self._task_id).answer)
        # A 135M model rarely boxes its answer: its last number counts as the answer.
        result = grade(action, reference, self.grading_timeout, allow_bare_number=True)
        score = 1.0 if result.correct else 0.0
        return Turn(
            done=True,
            reward=score,
            success=result.correct,
            reward_parts={"correct": score},
            info={
                "extracted_answer": result.extracted,
                "reference": reference,
                "grade_method": result.method,
                "grade_timed_out": result.timed_out,
            },
        )


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
