"""The process pool the demo, the sequential experiment and the benchmarks run their jobs on.

Every job is its own spawned process (its own threads and engine). Two scheduling rules keep a
2-core machine busy to the end of a run of jobs of very different lengths:

- **Follow-ups start as soon as their job ends.** ``then(job, result)`` returns the
  jobs that need this one's result (pass@k of a final adapter, a stage-2 run continuing it);
  they join the queue at once instead of waiting for the slowest job of the first phase.
- **The critical path runs first.** Jobs for which ``urgent(job)`` holds (the slowest run and
  its follow-ups) keep the normal CPU priority; the others run at ``nice`` +10, so the kernel
  gives an urgent job nearly a whole core while it shares one with them, and the others take
  what is left. Priority never changes a result: every job's sampling is seeded.

Thread counts stay each job's own: a job's numbers must not depend on what else happened to be
running when it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import get_context
from typing import Any

Body = Callable[[Any], dict[str, Any]]
Then = Callable[[Any, dict[str, Any]], list[Any]]
# the niceness of a job off the critical path: CFS weights nice 0 against nice 10 about 9 : 1
BACKGROUND_NICE = 10


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM raises ``SystemExit(143)`` in this (main) thread for the block's length, so the
    pool's with-block is left as on Ctrl-C and the pool terminates its workers. By default a
    SIGTERM ends this process alone, and its workers went on training as orphans."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_at_priority(body: Body, job: Any, nice: int) -> dict[str, Any]:
    """A pool process's entry: lower its own priority by ``nice``, then run the job."""
    if nice:
        os.nice(nice)
    return body(job)


def run_jobs(
    jobs: list[Any],
    workers: int,
    body: Body,
    announce: Callable[[Any, dict[str, Any]], None],
    *,
    then: Then | None = None,
    urgent: Callable[[Any], bool] | None = None,
    known: Callable[[Any], dict[str, Any] | None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``jobs`` and their follow-ups on ``workers`` fresh processes (in this one when 1),
    printing each as it ends (``announce(job, result)``). ``body`` runs one job (a module-level
    function, so spawned workers can import it); ``then(job, result)`` gives a
    finished job's follow-ups. ``known(job)`` gives the result of a job that finished before
    (a resumed experiment's): it is taken as the job's result, without running the job.

    Returns the results of ``jobs`` in their order, then those of the follow-ups in their
    parents' order (each parent's in the order ``then`` gave them). The first failure, Ctrl-C
    or SIGTERM (as ``SystemExit(143)``) terminates the workers and is raised."""
    follow: dict[int, list[int]] = {}  # parent index -> its follow-ups' indices
    queue, results = list(jobs), {}

    def done(i: int, result: dict[str, Any]) -> list[int]:
        announce(queue[i], result)
        results[i] = result
        if then is None:
            return []
        children = then(queue[i], result)
        follow[i] = list(range(len(queue), len(queue) + len(children)))
        queue.extend(children)
        return follow[i]

    def ready(i: int) -> dict[str, Any] | None:
        return None if known is None else known(queue[i])

    if workers == 1:
        todo = list(range(len(jobs)))
        with _sigterm_as_exit():  # a trainer running here takes SIGTERM over while it trains
            while todo:
                i = todo.pop(0)
                todo[:0] = done(i, ready(i) or body(queue[i]))
    else:
        # one process per job (maxtasksperchild=1): each starts with its own threads and
        # engine; leaving the with-block terminates the pool, so an error does not wait
        with _sigterm_as_exit(), get_context("spawn").Pool(workers, maxtasksperchild=1) as pool:
            pending: dict[int, Any] = {}

            def submit(i: int) -> None:
                result = ready(i)
                if result is not None:  # done before: its follow-ups are due now
                    for child in done(i, result):
                        submit(child)
                    return
                nice = 0 if urgent is None or urgent(queue[i]) else BACKGROUND_NICE
                pending[i] = pool.apply_async(_run_at_priority, (body, queue[i], nice))

            for i in range(len(jobs)):
                submit(i)
            while pending:
                for i in [i for i, result in pending.items() if result.ready()]:
                    result = pending.pop(i).get()  # re-raises its error
                    for child in done(i, result):
                        submit(child)
                time.sleep(0.2)
    order = list(range(len(jobs)))
    for i in order:  # grows as it walks: follow-ups of follow-ups come after their parents
        order.extend(follow.get(i, []))
    return [results[i] for i in order]
