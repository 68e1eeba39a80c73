"""``entrogym/World-v0``: a small world shaped like AppWorld, at a 135M model's scale.

Four apps (contacts, messages, calendar, shop) over an in-memory state are the env's tools
(:mod:`.apps`); tasks come from templates with ``train``, ``test_normal`` and
``test_challenge`` splits and scenarios of three tasks (:mod:`.tasks`); the final state is
graded by checks, including one for collateral damage (:mod:`.grading`). The episode ends when
the agent answers without a tool call (e.g. "done"), or at ``max_turns``; either way the world
is graded as the agent left it. Reward: the fraction of checks passed; success (TGC): all.

The env implements the text-env contract's evaluation hooks: ``eval_split`` is
``test_normal``; ``on_turn_budget`` is ``step`` (a turn cut at the token budget still runs its
calls); the eval summary gains TGC and SGC (scenario goal completion: every task of a
scenario completed), each task row its scenario and template.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from entrogym.envs.appworld.metrics import completion_by_sample, completion_text
from entrogym.envs.base import Turn
from entrogym.envs.tool_env import ToolEnv
from entrogym.envs.world.apps import Apps
from entrogym.envs.world.demos import DEFAULT_DEMONSTRATIONS, DEMONSTRATIONS, demonstration
from entrogym.envs.world.grading import grade, reward, task_goal_completed
from entrogym.envs.world.tasks import SPLITS, Task, generate, scenario_of

DEFAULT_MAX_TURNS = 6


class WorldEnv(ToolEnv):
    """The world's tasks of one split.

    Args:
        split: ``train``, ``test_normal`` or ``test_challenge`` (the split ``reset`` draws from
            without a ``task_id``).
        task_seed: seed of the task set (the same seed gives the same tasks on any machine).
        train_scenarios: scenarios per template in ``train`` (3 tasks each).
        test_scenarios: scenarios per template in ``test_normal`` and ``test_challenge``.
        max_turns: actions per episode; at the limit the world is graded as left.
        demonstrations: names of the worked examples shown before the task (reset info
            ``"demonstration"``), from :data:`~entrogym.envs.world.demos.DEMONSTRATIONS`.
    """

    reset_option_keys = frozenset({"task_id", "split"})
    eval_split = "test_normal"
    # A turn cut at the agent's token budget still runs its calls: the world, not the text, is
    # graded (as AppWorld's env does).
    on_turn_budget = "step"

    def __init__(
        self,
        *,
        split: str = "train",
        task_seed: int = 0,
        train_scenarios: int = 40,
        test_scenarios: int = 8,
        max_turns: int = DEFAULT_MAX_TURNS,
        demonstrations: Sequence[str] = DEFAULT_DEMONSTRATIONS,
        render_mode: str | None = None,
    ) -> None:
        for name, value, low in (("task_seed", task_seed, 0),
                                 ("train_scenarios", train_scenarios, 1),
                                 ("test_scenarios", test_scenarios, 1)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        unknown = [d for d in demonstrations if d not in DEMONSTRATIONS]
        if isinstance(demonstrations, str) or unknown:
            raise ValueError(f"demonstrations must be a list of names from "
                             f"{list(DEMONSTRATIONS)}, got {demonstrations!r}")  # fmt: skip
        self.task_seed = task_seed
        self._demonstration = demonstration(tuple(demonstrations))
        self._tasks: dict[str, dict[str, Task]] = {
            s: {t.task_id: t for t in generate(s, train_scenarios if s == "train"
                                               else test_scenarios, task_seed)}
            for s in SPLITS
        }  # fmt: skip
        self._apps = Apps()
        self._task: Task | None = None
        super().__init__(split=split, max_turns=max_turns, render_mode=render_mode)
        self.resolve_split(split)

    # ----- tasks -------------------------------------------------------------------------

    @property
    def splits(self) -> tuple[str, ...]:
        return SPLITS

    def task_ids(self, split: str | None = None) -> list[str]:
        return list(self._tasks[self.resolve_split(split)])

    def has_task(self, task_id: str) -> bool:
        return any(task_id in tasks for tasks in self._tasks.values())

    def task(self, task_id: str) -> Task:
        """The instruction, initial world and goals of ``task_id``."""
        for tasks in self._tasks.values():
            if task_id in tasks:
                return tasks[task_id]
        raise ValueError(f"unknown task_id {task_id!r}; list the valid ones with task_ids(split)")

    # ----- episode -----------------------------------------------------------------------

    def tools(self) -> list[Callable[..., Any]]:
        return self._apps.tools()

    def _start_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        task = self.task(task_id)
        self._task = task
        self._apps.load(task.state.copy())
        return task.instruction, {"demonstration": [dict(m) for m in self._demonstration]}

    def _grade(self) -> Turn:
        assert self._task is not None
        checks = grade(self._task.goals, self._task.state, self._apps.state)
        return Turn(
            done=True,
            reward=reward(checks),
            success=task_goal_completed(checks),
            reward_parts={c.name: float(c.passed) for c in checks},
            info={"scenario_id": self._task.scenario_id, "template": self._task.template},
        )

    # ----- evaluation hooks ----------------------------------------------------------------

    def evaluation_task_fields(self, task_id: str, episodes: list[Any]) -> dict[str, Any]:
        return {"scenario_id": scenario_of(task_id), "template": self.task(task_id).template}

    def evaluation_report(
        self, results: dict[str, Any], out_dir: Path | None, **options: Any
    ) -> dict[str, Any]:
        """TGC and SGC of the evaluation (per sample index, averaged)."""
        fields = completion_by_sample(
            results["episodes"], results["tasks"], results["samples"], scenario_of
        )
        fields["summary_text"] = completion_text(fields["tgc"], fields["sgc"])
        return fields
