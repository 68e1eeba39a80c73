"""``entrogym/AppWorld-v0``: AppWorld tasks as a multi-turn Gymnasium text env.

The agent writes Python against the apps' APIs; each action's code blocks run in the task's
world on the real AppWorld environment server (see :mod:`.runtime`), the observation is the
output or the error trace. The episode ends when the agent marks the task complete
(``apis.supervisor.complete_task(...)``), at ``max_turns``, or at the context limit; then
AppWorld's own evaluator runs the task's unit tests and the reward is the share of passing
tests (``reward="fraction"``, training) or 1 if all pass (``"binary"``, evaluation).

Each env owns one server process, started on the first reset and stopped by ``close()``;
AppWorld's server holds one world, so concurrent episodes (grouped rollouts) use one env each.
Every episode writes to its own AppWorld experiment folder, removed after evaluation unless
``experiment_name`` is given (``entrogym eval`` keeps them for AppWorld's own report).

The env implements the text-env contract's optional evaluation hooks
(:class:`entrogym.envs.contract.EvaluationHooks`), which ``entrogym eval`` reaches with
``env.get_wrapper_attr``: ``on_turn_budget = "step"``,
:meth:`AppWorldEnv.evaluation_env_kwargs`, :meth:`AppWorldEnv.evaluation_task_fields` and
:meth:`AppWorldEnv.evaluation_report` (TGC/SGC and AppWorld's own evaluator's report;
:mod:`.report`).
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from pathlib import Path
from typing import Any

from entrogym.envs.appworld import report
from entrogym.envs.appworld.client import AppWorldClient, ServerDied, ServerError
from entrogym.envs.appworld.metrics import scenario_id
from entrogym.envs.appworld.prompt import (
    NO_CODE_FEEDBACK,
    clip_output,
    extract_code,
    first_observation,
)
from entrogym.envs.appworld.runtime import AppWorldServer, check_root
from entrogym.envs.base import DEFAULT_MAX_CHARS, TextEnv, Turn

SPLITS = ("train", "dev", "test_normal", "test_challenge")
EVAL_SPLITS = ("test_normal", "test_challenge")
REWARDS = ("fraction", "binary")


class AppWorldEnv(TextEnv):
    """AppWorld tasks of one split.

    Args:
        split: ``train``, ``dev``, ``test_normal`` or ``test_challenge``.
        appworld_root: folder holding AppWorld's ``data/`` (real data or the fixture world);
            defaults to ``$APPWORLD_ROOT``.
        max_turns: actions per episode; default 30 (training splits) or 50 (test splits).
        reward: ``"fraction"`` (default on training splits) or ``"binary"`` (test splits).
        exec_timeout_s: seconds one execution may run before AppWorld stops it.
        max_output_chars: longer outputs are cut (head and tail kept) in the observation.
        max_context_chars: the episode ends once the conversation exceeds this many characters.
        memory_limit_mb: address-space limit of the server process.
        experiment_name: AppWorld experiment folder to keep the outputs in (None: a fresh
            folder per episode, deleted after evaluation).
        venv: the AppWorld virtualenv (default ``.venv-appworld`` at the repository root).
        port: server port (None: a free one).
    """

    reset_option_keys = frozenset({"task_id", "split"})
    # A turn cut at the agent's token budget still runs its code: the world, not the text, is
    # what AppWorld's unit tests score at the end.
    on_turn_budget = "step"

    def __init__(
        self,
        split: str = "train",
        appworld_root: str | Path | None = None,
        *,
        max_turns: int | None = None,
        reward: str | None = None,
        exec_timeout_s: int = 10,
        max_output_chars: int = 8000,
        max_context_chars: int = 128_000,
        memory_limit_mb: int = 4096,
        experiment_name: str | None = None,
        venv: str | Path | None = None,
        port: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r} for AppWorld; choose one of {list(SPLITS)}")
        evaluation = split in EVAL_SPLITS
        reward = reward or ("binary" if evaluation else "fraction")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {list(REWARDS)}, got {reward!r}")
        if not isinstance(exec_timeout_s, int) or exec_timeout_s < 1:
            raise ValueError(f"exec_timeout_s must be a positive integer, got {exec_timeout_s!r}")
        super().__init__(
            split=split,
            max_turns=max_turns if max_turns is not None else (50 if evaluation else 30),
            max_observation_chars=max(DEFAULT_MAX_CHARS, max_output_chars + 8192),
            max_action_chars=max_context_chars,
            render_mode=render_mode,
        )
        self.root = check_root(appworld_root)
        self.reward_mode = reward
        self.exec_timeout_s = exec_timeout_s
        self.max_output_chars = max_output_chars
        self.max_context_chars = max_context_chars
        self.experiment_name = experiment_name
        self.server = AppWorldServer(
            self.root, venv=venv, port=port, memory_limit_mb=memory_limit_mb,
            log_path=None,
        )  # fmt: skip
        self.client: AppWorldClient | None = None
        self._env_uid = uuid.uuid4().hex[:8]
        self._episode = 0
        self._open_task: str | None = None
        self._experiment: str | None = None
        self._context_chars = 0
        self._split_cache: dict[str, list[str]] = {}

    # ----- tasks -------------------------------------------------------------------------

    @property
    def splits(self) -> tuple[str, ...]:
        return SPLITS

    def task_ids(self, split: str | None = None) -> list[str]:
        name = self.resolve_split(split)
        if name not in self._split_cache:
            path = self.root / "data" / "datasets" / f"{name}.txt"
            if not path.exists():
                raise ValueError(f"split {name!r} has no task list at {path}")
            ids = [
                line.split(":")[0].strip() for line in path.read_text().splitlines() if line.strip()
            ]
            if not ids:
                raise ValueError(f"split {name!r} has no tasks ({path} is empty)")
            self._split_cache[name] = ids
        return list(self._split_cache[name])

    def has_task(self, task_id: str) -> bool:
        if not (self.root / "data" / "tasks" / task_id / "specs.json").exists():
            return False
        return any(task_id in self.task_ids(s) for s in self.splits if self._split_exists(s))

    def _split_exists(self, split: str) -> bool:
        return (self.root / "data" / "datasets" / f"{split}.txt").exists()

    # ----- episode -------------------------------------------------------------------------

    def _ensure_server(self) -> AppWorldClient:
        if not self.server.alive():
            if self.server.process is not None or self.client is not None:
                self.server.restart()
            else:
                self.server.start()
            self.client = AppWorldClient(
                self.server.url, request_timeout_s=self.exec_timeout_s + 60
            )
        assert self.client is not None
        return self.client

    def _start_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        self._finish_open_episode()
        self._episode += 1
        experiment = self.experiment_name or f"entrogym-{self._env_uid}-{self._episode}"
        client = self._ensure_server()
        try:
            task = client.initialize(task_id, experiment, timeout_seconds=self.exec_timeout_s)
        except ServerDied:
            self.server.restart()
            client = self._ensure_server()
            task = client.initialize(task_id, experiment, timeout_seconds=self.exec_timeout_s)
        self._open_task, self._experiment = task_id, experiment
        observation = first_observation(task)
        self._context_chars = len(observation)
        return observation, {
            "scenario_id": scenario_id(task_id),
            "experiment_name": experiment,
            "instruction": task["instruction"],
            "reward_mode": self.reward_mode,
        }

    def _respond(self, action: str) -> Turn:
        task_id = self._task_id
        assert task_id is not None and self.client is not None
        self._context_chars += len(action)
        code = extract_code(action)
        if code is None:
            return self._maybe_context_end(
                Turn(observation=NO_CODE_FEEDBACK, info={"no_code": True})
            )
        try:
            output = self.client.execute(task_id, code, timeout_s=self.exec_timeout_s + 60)
            completed = self.client.task_completed(task_id)
        except (ServerDied, ServerError) as exc:
            return self._server_failure(exc)
        observation = clip_output(output, self.max_output_chars)
        if completed:
            return self._evaluate(
                Turn(observation=observation, done=True, info={"completed": True})
            )
        return self._maybe_context_end(Turn(observation=observation))

    def _maybe_context_end(self, turn: Turn) -> Turn:
        self._context_chars += len(turn.observation)
        if self._context_chars <= self.max_context_chars:
            return turn
        turn.done = True
        turn.info["context_limit_reached"] = True
        return self._evaluate(turn)

    def _on_truncate(self) -> Turn:
        return self._evaluate(Turn(done=True))

    def _evaluate(self, turn: Turn) -> Turn:
        """Run AppWorld's evaluator on the world as it is now and fill the terminal reward."""
        task_id = self._task_id
        assert task_id is not None and self.client is not None
        try:
            tracker = self.client.evaluate(task_id)
        except (ServerDied, ServerError) as exc:
            failed = self._server_failure(exc)
            failed.observation = turn.observation or failed.observation
            return failed
        passes, fails = len(tracker["passes"]), len(tracker["failures"])
        num_tests = int(tracker["num_tests"])
        fraction = passes / num_tests if num_tests else 0.0
        success = bool(tracker["success"])
        turn.done = True
        turn.success = success
        turn.reward = fraction if self.reward_mode == "fraction" else float(success)
        turn.reward_parts = {"fraction": fraction, "binary": float(success)}
        turn.info.update(
            passes=passes,
            fails=fails,
            num_tests=num_tests,
            task_goal_completion=float(success),
            scenario_id=scenario_id(task_id),
            failed_requirements=[f["requirement"] for f in tracker["failures"]],
            experiment_name=self._experiment,
        )
        self._finish_open_episode()
        return turn

    def _server_failure(self, exc: Exception) -> Turn:
        """The server died or broke mid-episode: this episode fails, the server restarts."""
        died = isinstance(exc, ServerDied) or not self.server.alive()
        self._open_task = None
        self.server.restart()
        self.client = AppWorldClient(self.server.url, request_timeout_s=self.exec_timeout_s + 60)
        self._cleanup_outputs()
        return Turn(
            observation=f"The AppWorld environment failed and this episode ended: {exc}",
            done=True,
            reward=0.0,
            success=False,
            reward_parts={"fraction": 0.0, "binary": 0.0},
            info={"server_failure": True, "server_died": died, "error": str(exc)[:2000],
                  "scenario_id": scenario_id(self._task_id or "x_0")},
        )  # fmt: skip

    def _finish_open_episode(self) -> None:
        if self._open_task is not None and self.client is not None and self.server.alive():
            with contextlib.suppress(ServerDied, ServerError):
                self.client.close(self._open_task)
        self._open_task = None
        self._cleanup_outputs()

    def _cleanup_outputs(self) -> None:
        if self.experiment_name is None and self._experiment is not None:
            shutil.rmtree(
                self.root / "experiments" / "outputs" / self._experiment, ignore_errors=True
            )
            self._experiment = None

    # ----- evaluation hooks (``env.get_wrapper_attr(name)`` from the eval command) ---------

    def evaluation_env_kwargs(self, samples: int) -> dict[str, Any]:
        """Env keyword arguments for an evaluation's rollouts with ``samples`` per task:
        ``reward="binary"``, ``max_turns=50`` and, with one sample per task, a fresh shared
        ``experiment_name`` (outputs kept for :meth:`evaluation_report`). The command's own
        options win over these."""
        return report.evaluation_env_kwargs(samples)

    def evaluation_task_fields(self, task_id: str, episodes: list[Any]) -> dict[str, Any]:
        """Per-task columns of an evaluation: ``passes``, ``fails``, ``num_tests`` (one entry
        per sample of ``task_id``, None where AppWorld never scored it) and ``scenario_id``."""
        return report.task_fields(task_id, episodes)

    def evaluation_report(
        self, results: dict[str, Any], out_dir: Path | None, **options: Any
    ) -> dict[str, Any]:
        """Extra summary fields of an evaluation on this env's AppWorld root.

        ``results``: ``episodes`` (the eval's :class:`~entrogym.agents.episode.Episode` s),
        ``tasks`` (the task ids evaluated, in order), ``samples`` (per task) and ``split``.
        ``out_dir``: where copies of AppWorld's report files go (``appworld-report.json`` and
        ``.txt``; None: none). ``options``: ``report_name`` (default: the split),
        ``run_report`` (default True), ``timeout_s`` (600).

        Returns ``tgc``, ``sgc`` (fractions, averaged over the samples), ``tgc_runs``,
        ``sgc_runs``, ``not_evaluated`` (episodes that ended before AppWorld scored them),
        ``appworld_report`` (AppWorld's own evaluator's result, or why it was skipped: it needs
        one sample per task and the outputs kept), ``summary_text`` (``TGC=..% SGC=..%``) and
        ``report_lines`` (both for the printed summary) and, when the report ran,
        ``experiment_name``.
        """
        return report.evaluation_report(self.root, results, out_dir, **options)

    def close(self) -> None:
        self._finish_open_episode()
        self.server.stop()
        super().close()
