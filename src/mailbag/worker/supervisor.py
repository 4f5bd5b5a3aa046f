"""The worker's side tasks (outcome writer, lease keeper, listener, periodic jobs): started
in one place, and each runs as long as the worker does.

A side task that ends, however it ended, halts the worker: it logs one line naming the
task, sets `halted`, and `failure` holds the WorkerFailed that `Worker.run` raises once it
has drained. Never a half-alive worker (a writer that died would leave the lease keeper
renewing messages whose outcome is never written). `stop` ends them all on purpose.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from mailbag.clock import Clock
from mailbag.providers.kit import describe
from mailbag.worker.config import PeriodicJob
from mailbag.worker.failures import DB_ERRORS, WorkerFailed


class SideTasks:
    def __init__(self, log: Any) -> None:
        self.log = log
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.halted = asyncio.Event()
        self.failure: WorkerFailed | None = None

    def start(self, name: str, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return self.watch(asyncio.create_task(work, name=name))

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
    """A job the entry point hands in (reconciliation), every so often; its database errors
    are logged and it runs again next time (anything else is a bug: the job's task dies,
    and with it the worker)."""
    while True:
        await asyncio.sleep(job.every)
        try:
            outcome = await job.run(clock())
        except DB_ERRORS as exc:
            log.warning("periodic_job_failed", job=job.name, error=describe(exc))
            continue
        if outcome:
            log.info(job.name, **outcome)
