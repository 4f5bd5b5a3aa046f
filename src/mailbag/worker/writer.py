"""The outcome writer: decisions are put one at a time and written in batches.

Shaped like PgQueuer's `TimedOverflowBuffer`:
- flush on size or time: a batch is written when `max_size` items wait, or `max_wait`
  seconds after its first item came (0: at once, taking whatever accumulated while the
  last write ran: the busier the worker, the larger the batch);
- a write that fails with a `retry_on` error is kept and tried again, backing off (the
  sends happened; their outcomes must not be lost). Any other error is a bug: it ends
  `run`, and the batch stays held for `drain`;
- drain on exit: `drain` waits until everything put has been written, replacing a task
  that died once (for the drain only) with the batch it held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from mailbag.providers.kit import describe
from mailbag.worker.failures import Backoff

T = TypeVar("T")
R = TypeVar("R")


class OutcomeWriter(Generic[T, R]):
    def __init__(
        self,
        write: Callable[[list[T]], Awaitable[R]],
        written: Callable[[list[T], R], None],
        *,
        max_size: int,
        max_wait: float = 0.0,
        backoff: tuple[float, float],
        retry_on: tuple[type[BaseException], ...],
        log: Any,
        name: str = "mailbag-finalizer",
    ) -> None:
        self.write, self.written = write, written
        self.max_size, self.max_wait = max_size, max_wait
        self.backoff, self.retry_on = backoff, retry_on
        self.log, self.name = log, name
        self.task: asyncio.Task[None] | None = None
        self._waiting: list[T] = []  # put, not yet taken for a write
        self._writing: list[T] = []  # taken, not yet written
        self._arrived = asyncio.Event()
        self._idle = asyncio.Event()  # nothing waiting, nothing being written
        self._idle.set()

    @property
    def pending(self) -> int:
        return len(self._waiting) + len(self._writing)

    def put(self, item: T) -> None:
        self._waiting.append(item)
        self._idle.clear()
        self._arrived.set()

    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.run(), name=self.name)
        return self.task

    async def run(self) -> None:
        while True:
            batch = await self._next_batch()
            self._writing = batch  # if this task dies, the drain writes these again
            result = await self._write(batch)
            self._writing = []
            if not self._waiting:
                self._idle.set()
            self.written(batch, result)

    async def _next_batch(self) -> list[T]:
        while not self._waiting:
            self._arrived.clear()
            await self._arrived.wait()
        if self.max_wait > 0 and len(self._waiting) < self.max_size:
            deadline = asyncio.get_running_loop().time() + self.max_wait
            while len(self._waiting) < self.max_size:
                self._arrived.clear()
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    async with asyncio.timeout(left):
                        await self._arrived.wait()
                except TimeoutError:
                    break
        if len(self._waiting) <= self.max_size:  # the usual case: take them all, no copy
            batch, self._waiting = self._waiting, []
        else:
            batch = self._waiting[: self.max_size]
            del self._waiting[: self.max_size]
        return batch

    async def _write(self, batch: list[T]) -> R:
        backoff = Backoff(*self.backoff)
        while True:
            try:
                return await self.write(batch)
            except self.retry_on as exc:
                delay = backoff.next()
                self.log.warning(
                    "finalize_failed", error=describe(exc), retry_in=delay, pending=len(batch)
                )
                await asyncio.sleep(delay)

    async def drain(self, grace: float) -> bool:
        """Write everything put so far, within `grace` seconds. True when nothing is left.

        Run on the way out. A task that died is replaced, once and for the drain only, by
        one that writes the batch it held first; what still cannot be written is left."""
        if not self.pending:
            return True
        task, replacement = self.task, None
        if task is None or task.done():
            self._waiting[:0], self._writing = self._writing, []
            task = replacement = asyncio.create_task(self.run(), name=self.name)
        idle = asyncio.ensure_future(self._idle.wait())
        try:
            await asyncio.wait({idle, task}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        finally:
            idle.cancel()
        if task.done() and not task.cancelled() and task.exception():
            self.log.error("finalize_failed_at_shutdown", exc_info=task.exception())
        if replacement is not None:
            replacement.cancel()
            await asyncio.gather(replacement, return_exceptions=True)
        return not self.pending
