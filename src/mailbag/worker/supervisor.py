"""The worker's side tasks: started in one place, and each runs as long as the worker does.
They are of two kinds (DESIGN.md, "Mail keeps flowing"):

- essential (`watch`): what a send needs, the outcome writer and the lease keeper. One that
  ends, however it ended, halts the worker: it logs one line naming the task, sets
  `halted`, and `failure` holds the WorkerFailed that `Worker.run` raises once it has
  drained. Never a half-alive worker (a writer that died would leave the lease keeper
  renewing messages whose outcome is never written).
- optional (`start_optional`): everything else (the listener, hook deliveries, the
  scheduler and its jobs). One that raises is logged, counted in
  `mailbag_side_task_failures_total{task}` and started again after a backoff (1 s,
  doubling to a minute, reset once it has run a minute without failing); mail goes on.

`stop` ends them all on purpose.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from mailbag import metrics
from mailbag.clock import Clock
from mailbag.providers.kit import describe
from mailbag.worker.config import PeriodicJob
from mailbag.worker.failures import DB_ERRORS, Backoff, WorkerFailed

# How long an optional part waits before it starts again after a failure (doubling), and
# how long it must run without one for the wait to start from the first step again.
RESTART_BACKOFF = (1.0, 60.0)
HEALTHY_AFTER = 60.0


class SideTasks:
    def __init__(self, log: Any) -> None:
        self.log = log
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.halted = asyncio.Event()
        self.failure: WorkerFailed | None = None

    def start(self, name: str, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """An essential task: if it ends, the worker stops."""
        return self.watch(asyncio.create_task(work, name=name))

    def start_optional(
        self, name: str, work: Callable[[], Coroutine[Any, Any, None]]
    ) -> asyncio.Task[None]:
        """An optional part, `work()` run again after a backoff whenever it fails (or ends)."""
        return self.watch(asyncio.create_task(self._keep_running(name, work), name=name))

    async def _keep_running(self, name: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        backoff = Backoff(*RESTART_BACKOFF)
        while True:
            started = time.monotonic()
            try:
                await work()
                error: BaseException | None = None
            except Exception as exc:  # anything: a bug in an optional part must not stop mail
                error = exc
            if time.monotonic() - started >= HEALTHY_AFTER:
                backoff.reset()
            delay = backoff.next()
            metrics.SIDE_TASK_FAILURES.labels(name).inc()
            self.log.error(
                "side_task_failed",
                task=name,
                error=describe(error) if error else "returned",
                restart_in=delay,
                exc_info=error,
            )
            await asyncio.sleep(delay)

    def watch(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        task.add_done_callback(self._ended)
        self.tasks[task.get_name()] = task
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self.failure is not None:
            return
        error = None if task.cancelled() else task.exception()
        what = "cancelled" if task.cancelled() else describe(error) if error else "returned"
        self.log.error("worker_helper_died", helper=task.get_name(), error=what, exc_info=error)
        self.failure = WorkerFailed(
            f"the worker's {task.get_name()} task died ({what}); "
            "the worker drained and stopped: restart it"
        )
        self.failure.__cause__ = error
        self.halted.set()

    async def stop(self) -> None:
        tasks, self.tasks = list(self.tasks.values()), {}
        for task in tasks:
            task.remove_done_callback(self._ended)  # ended on purpose
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_regularly(job: PeriodicJob, clock: Clock, log: Any) -> None:
    """A job the entry point hands in (the scheduler, hook deliveries), every so often; its
    database errors are logged and it runs again next time (anything else is a bug: it
    ends this run, and the supervisor starts the job again after a backoff)."""
    while True:
        await asyncio.sleep(job.every)
        try:
            outcome = await job.run(clock())
        except DB_ERRORS as exc:
            log.warning("periodic_job_failed", job=job.name, error=describe(exc))
            continue
        if outcome:
            log.info(job.name, **outcome)
