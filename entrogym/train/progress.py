"""Progress bars (tqdm) for long work: the iterations, each iteration's rollouts and update,
the target probe's batches and held-out evaluation, with their counts and an ETA.

Bars go to stderr, and only when stderr is a terminal, so log files, CI output, tests and the
demo's labelled pool workers stay free of bar redraws; they are cleared when their work ends,
leaving the one line per iteration the trainer prints. ``ENTROGYM_PROGRESS=1`` forces them on
(``0`` forces them off) whatever stderr is.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

PROGRESS_ENV = "ENTROGYM_PROGRESS"
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def bars_disabled() -> bool | None:
    """tqdm's ``disable``: False when ``ENTROGYM_PROGRESS`` forces bars on, True when it forces
    them off, else None (tqdm then shows them only on a terminal)."""
    value = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if value in _ON:
        return False
    if value in _OFF:
        return True
    if value:
        warnings.warn(
            f"{PROGRESS_ENV}={value!r} is neither 1 nor 0; progress bars show on a terminal only",
            RuntimeWarning,
            stacklevel=2,
        )
    return None


def progress(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    enabled: bool = True,
) -> Any:
    """A tqdm bar on stderr (module docstring); ``enabled=False`` (e.g. a torchrun rank other
    than 0) never shows one."""
    from tqdm.auto import tqdm

    disable = bars_disabled() if enabled else True
    return tqdm(
        iterable, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, disable=disable
    )


@contextlib.contextmanager
def counter(
    total: int, desc: str, unit: str, enabled: bool = True
) -> Iterator[Callable[[int], None]]:
    """A bar of ``total`` ``unit`` for the block; yields the function that sets its count
    (what ``collect_rollouts`` reports through ``on_progress``)."""
    with progress(total=total, desc=desc, unit=unit, enabled=enabled) as bar:

        def set_count(done: int) -> None:
            if done > bar.n:
                bar.update(done - bar.n)

        yield set_count
