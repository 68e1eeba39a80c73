"""The task pairs of the sequential experiment (``--pair``): task A, task B and why they were
paired; docs/sequential.md says how they were chosen."""

from __future__ import annotations

from dataclasses import dataclass

from entrogym.experiments.pass_at_k import Task


@dataclass(frozen=True)
class TaskPair:
    """Task A (stage 1) and task B (stage 2), with why they were paired."""

    a: Task
    b: Task
    why: str


ARITHMETIC = "entrogym/Arithmetic-v0"
# one-digit + and -, the demo's task: task A of the first pairs
ADD1 = Task(ARITHMETIC, {"max_digits": 1, "num_train": 100, "num_test": 40})
# one-digit + and - with negative answers: task A of the later pairs
NEG1 = Task(ARITHMETIC, {"max_digits": 1, "allow_negative": True, "num_train": 100, "num_test": 40})
# the multi-turn world (docs/envs.md, "The world"), held out on test_normal, with the settings of
# examples/configs/world-quickstart.yaml (a test keeps them equal): the env's own prompt (no
# calculator's), one-line calls, room for the tools, two worked examples and six turns;
# micro-batches of 4 at that context, the shared opening run once in the update. The base
# model's test_normal TGC is 15.6 % (docs/results.md, 2026-12-05 21:09).
WORLD = Task(
    "entrogym/World-v0",
    {},
    held_out="test_normal",
    settings={
        "system_prompt": None,
        "tool_format": "call",
        "max_context_tokens": 2048,
        "micro_batch_size": 4,
        "score_layout": "shared-prefix",
    },
)
PAIRS: dict[str, TaskPair] = {
    "add1-add2": TaskPair(
        a=ADD1,
        b=Task(ARITHMETIC, {"max_digits": 2, "num_train": 200, "num_test": 40}),
        why="one-digit + and - (the demo's task), then operands of one or two digits",
    ),
    # B in the 20-60 % band asked of a second task (base pass@1 0.23, docs/results.md)
    "add1-mixed": TaskPair(
        a=ADD1,
        b=Task(
            ARITHMETIC, {"max_digits": 1, "operations": "+-*", "num_train": 100, "num_test": 40}
        ),
        why="one-digit + and - (the demo's task), then one-digit +, - and * (* is new)",
    ),
    # a single operator to collapse onto, then another; B's base pass@1 0.24, in the 20-60 %
    # band. The highest mean stage-2 lead on seeds 0-2, reversed on seeds 3-5 (docs/results.md,
    # 2026-11-28 14:55 and 2026-11-29 16:16)
    "add-mul": TaskPair(
        a=Task(ARITHMETIC, {"max_digits": 1, "operations": "+", "num_train": 40, "num_test": 20}),
        b=Task(ARITHMETIC, {"max_digits": 1, "operations": "*", "num_train": 40, "num_test": 20}),
        why="one-digit + alone, then one-digit * (another operation on the same operands)",
    ),
    # A that a collapse leaves partly unsolved (base pass@1 0.22; GRPO ends with a quarter of
    # it out of reach in 32 samples), then a B that a screen of the stage-1 policies picked:
    # the held starts reach more of it (docs/results.md, 2026-11-29 10:03 and 10:30)
    "neg-mixed": TaskPair(
        a=NEG1,
        b=Task(
            ARITHMETIC, {"max_digits": 1, "operations": "+-*", "num_train": 100, "num_test": 40}
        ),
        why="one-digit + and - with negative answers, then one-digit +, - and *",
    ),
    # a B from another domain, so that A's arithmetic carries less and the starting policy's
    # exploration more: reasoning-gym's gcd scaled to a 135M model and graded by the last
    # number (base pass@1 0.16, pass@8 0.63: most tasks within reach of sampling, few of the
    # first sample; docs/results.md, 2026-12-02 01:58)
    "neg-gcd": TaskPair(
        a=NEG1,
        b=Task(
            "entrogym/ReasoningGym-v0",
            {
                "dataset": "gcd",
                "config": {"max_value": 10},
                "size": 100,
                "test_size": 40,
                "seed": 0,
                "bare_number": True,
            },
        ),
        why="one-digit + and - with negative answers, then the gcd of two numbers up to 10",
    ),
    # a task switch: |a - b| after signed a - b, where the sign A taught is wrong on 45 of 100
    # pairs (base pass@1 0.13, pass@8 0.58; docs/results.md, 2026-12-05 00:37 and 01:40)
    "neg-abs": TaskPair(
        a=NEG1,
        b=Task(
            ARITHMETIC,
            {
                "max_digits": 1,
                "operations": "-",
                "allow_negative": True,
                "absolute": True,
                "num_train": 60,
                "num_test": 40,
            },
        ),
        why="one-digit + and - with negative answers, then |a - b| of one-digit operands",
    ),
    # the paper's direction (AIME, then AppWorld): a math task on which GRPO collapses, then an
    # agent task that needs exploring (docs/sequential.md)
    "neg-world": TaskPair(
        a=NEG1,
        b=WORLD,
        why="one-digit + and - with negative answers, then the multi-turn world (tools over "
        "several turns)",
    ),
    # and back: the world first, then the math task
    "world-neg": TaskPair(
        a=WORLD,
        b=NEG1,
        why="the multi-turn world, then one-digit + and - with negative answers",
    ),
}
DEFAULT_PAIR = "add1-add2"
