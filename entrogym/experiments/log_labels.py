"""A demo run's log lines under its own label.

The trainer prints ``[<preset>] iter ...``: two demo runs of one preset (``grpo`` and
``held=grpo --algo.lever ...``) would share the ``[grpo]`` prefix in the demo's log. While a
demo job trains, its stdout and stderr go through ``LabelledStream``, which puts the run's
label in that prefix (and in front of every other line), so ``entrogym train`` itself prints
as before.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TextIO


class LabelledStream:
    """A text stream that writes whole lines to ``target``, each under ``[label]``: a line that
    starts with ``[preset] `` has that prefix replaced, any other line gets one in front."""

    def __init__(self, target: TextIO, label: str, preset: str) -> None:
        self.target, self.tag, self.preset_tag = target, f"[{label}] ", f"[{preset}] "
        self._partial = ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self.target.write(self._labelled(line) + "\n")
        return len(text)

    def _labelled(self, line: str) -> str:
        if line.startswith(self.preset_tag):
            line = line[len(self.preset_tag) :]
        return self.tag + line

    def flush(self) -> None:
        self.target.flush()

    def close_line(self) -> None:
        """Write what is left of an unfinished last line."""
        if self._partial:
            self.target.write(self._labelled(self._partial) + "\n")
            self._partial = ""
        self.target.flush()

    def isatty(self) -> bool:
        return False  # progress bars of jobs side by side would overwrite each other's lines


@contextlib.contextmanager
def labelled_output(label: str, preset: str) -> Iterator[None]:
    """stdout and stderr under ``[label]`` for the block (``preset``: the trainer's prefix)."""
    out, err = LabelledStream(sys.stdout, label, preset), LabelledStream(sys.stderr, label, preset)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):  # type: ignore[type-var]
            yield
    finally:
        out.close_line()
        err.close_line()
