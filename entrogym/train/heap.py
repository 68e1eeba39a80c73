"""Giving the heap memory a phase freed back to the operating system.

glibc's ``malloc`` keeps what a process frees on its heap for reuse, so after an update frees
its activations the process's resident memory stays where the update left it. The next
micro-batch's tensors come in other sizes, fit the freed holes only in part, and grow the heap
again: on SmolLM2 at the benchmark's shapes the trainer's resident memory settled ~1.1 GB above
what it held (docs/performance.md, "Peak memory"). ``malloc_trim(0)`` hands every free page
back (since glibc 2.8 also those inside the heap, by ``madvise``), at the price of faulting
them in again when they are next used.

:class:`HeapTrim` does that as a phase hook (:mod:`entrogym.train.phases`), after the phases
in ``TRIM_AFTER``. Where the C library has no ``malloc_trim`` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any

# Before the passes whose activations set the peak: after the rollouts (their prefill and
# decode buffers) and after each micro-batch's backward. Trimming after every phase lowered
# the peak no further and cost more than twice the time (docs/performance.md, "Peak memory").
TRIM_AFTER = frozenset({"generation", "backward"})


def malloc_trim() -> Callable[[], Any] | None:
    """The C library's ``malloc_trim(0)`` as a call, or None where it has none."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class HeapTrim:
    """Phase hook: ``malloc_trim(0)`` after every phase in ``after``."""

    def __init__(self, after: frozenset[str] = TRIM_AFTER) -> None:
        self.after = after
        self.trim = malloc_trim()

    def __call__(self, phase: str, seconds: float, info: dict[str, Any]) -> None:
        if self.trim is not None and phase in self.after:
            self.trim()
