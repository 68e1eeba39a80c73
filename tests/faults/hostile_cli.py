"""``entrogym train`` options for the hostile env on the tiny model, and the command's one line
of stderr: what the in-process fault tests share."""

from __future__ import annotations

from pathlib import Path

from vowel_env import TINY_SETTINGS


def hostile_args(out: Path, iterations: int = 1, **values: object) -> list[str]:
    """Options of an RLOO run on ``faults/Hostile-v0`` (its kwargs, if any, in ``values``)."""
    args = ["--env", "faults/Hostile-v0", "--algo", "rloo", "--out", str(out)]
    args += ["--iterations", str(iterations)]
    for key, value in {**TINY_SETTINGS, "tasks_per_iter": 4, **values}.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def one_line(err: str) -> str:
    """The command's one line; no traceback, no thread's exception."""
    lines = [line for line in err.splitlines() if line.startswith("entrogym train: ")]
    assert len(lines) == 1 and "Traceback" not in err and "Exception in thread" not in err, err
    return lines[0]
