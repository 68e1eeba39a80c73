"""Envs that misbehave on purpose, importable by env worker processes and CLI subprocesses
as ``hostile_envs:faults/Hostile-v0`` (with ``tests/faults`` on ``PYTHONPATH``).

``HostileEnv(fault=..., broken=("t0",))``: four single-turn tasks t0..t3. On the tasks in
``broken`` it does ``fault`` (hang, leak, crash, raise, a bad reply, ``slow``: three turns of
half a second); every other task ends at its first step with reward 1 when the action has an
even length, else 0. Each reply's info carries the pid of the process that ran
the env, so a test can tell where it ran. The import itself stays light (no torch): a worker
that imports this module starts in a fraction of a second.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from entrogym.envs import UnicodeText

_LEAKED: list[bytes] = []  # what the "leak" fault keeps alive for the life of the process


class HostileEnv(gym.Env):
    """A plain Gymnasium text env; ``fault`` on the tasks in ``broken`` (see the module)."""

    def __init__(
        self,
        fault: str = "none",
        broken: tuple[str, ...] | list[str] = ("t0",),
        leak_mb: int = 200,
        sabotage: str | None = None,
        sabotage_after: int = 0,
    ) -> None:
        self.fault, self.broken, self.leak_mb = fault, tuple(broken), leak_mb
        self.sabotage, self.sabotage_after = sabotage, sabotage_after
        self.observation_space = UnicodeText(1000)
        self.action_space = UnicodeText(100_000, min_length=1)
        self.task = ""
        self.turns = 0

    def task_ids(self, split: str | None = None) -> list[str]:
        return ["t0", "t1", "t2", "t3"]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.task = (options or {})["task_id"]
        self.turns = 0
        if self.task in self.broken and self.fault == "surrogate":
            return f"Task {self.task}: \ud800 say something.", {"pid": os.getpid()}
        if self.task in self.broken and self.fault == "hang-reset":
            time.sleep(3600)
        return f"Task {self.task}. Say something.", {"pid": os.getpid()}

    def step(self, action: str):
        self._maybe_sabotage()
        reward = float(len(action) % 2 == 0)
        fine = ("done", reward, True, False, {"success": reward == 1.0, "pid": os.getpid()})
        if self.task not in self.broken:
            return fine
        return self._fault(reward)

    def _fault(self, reward: float) -> tuple[Any, ...]:
        pid = os.getpid()
        if self.fault == "hang":
            time.sleep(3600)
        elif self.fault == "leak":
            _LEAKED.append(b"x" * (self.leak_mb << 20))  # written, so resident
        elif self.fault == "crash":
            os.kill(pid, signal.SIGKILL)
        elif self.fault == "exit":
            os._exit(3)
        elif self.fault == "raise":
            raise ConnectionError("grader service unreachable")
        elif self.fault == "success-string":
            return "done", 0.0, True, False, {"success": "False", "pid": pid}
        elif self.fault == "string-reward":
            return "done", "1.0", True, False, {"success": True, "pid": pid}
        elif self.fault == "early-reward":
            return "go on", 1.0, False, False, {"pid": pid}
        elif self.fault == "surrogate-step":
            return "bad \udcff byte", 0.0, False, False, {"pid": pid}
        elif self.fault == "slow":  # three turns of half a second each
            self.turns += 1
            time.sleep(0.5)
            if self.turns < 3:
                return "again", 0.0, False, False, {"pid": pid}
        return "done", reward, True, False, {"success": reward == 1.0, "pid": pid}

    def _maybe_sabotage(self) -> None:
        """Replace the folder ``sabotage`` by a plain file once ``sabotage_after`` steps have
        passed (counted in ``SABOTAGE.steps``, whatever process runs the env): a filesystem
        fault in the middle of a run."""
        if self.sabotage is None:
            return
        path = Path(self.sabotage)
        counter = path.with_name(path.name + ".steps")
        with open(counter, "ab") as fh:
            fh.write(b".")
        if counter.stat().st_size > self.sabotage_after and not path.is_file():
            if path.is_dir():
                path.rename(path.with_name(path.name + ".moved-away"))
            path.write_text("not a folder any more\n")


if "faults/Hostile-v0" not in gym.registry:
    gym.register("faults/Hostile-v0", entry_point="hostile_envs:HostileEnv")
