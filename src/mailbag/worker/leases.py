"""The lease keeper: while it is entered, every held message's lease is extended a few
times per lease, so a slow send is never swept from under the worker that holds it.

A database error is logged and the next round tries again (a lease is long enough to
miss a round or two); anything else ends the task, and the supervisor stops the worker:
never a worker whose leases outlive the rest of it. Leaving the block stops renewing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from types import TracebackType
from typing import Any

from mailbag.providers.kit import describe

ByToken = Mapping[uuid.UUID, list[uuid.UUID]]


class LeaseKeeper:
    def __init__(
        self,
        extend: Callable[[ByToken], Awaitable[None]],
        held: Callable[[], ByToken],
        *,
        lease: timedelta,
        retry_on: tuple[type[BaseException], ...],
        log: Any,
        name: str = "mailbag-leases",
    ) -> None:
        self.extend, self.held = extend, held
        self.period = max(lease.total_seconds() / 3, 0.05)
        self.retry_on, self.log, self.name = retry_on, log, name
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> asyncio.Task[None]:
        """Start renewing; the task is returned for a supervisor to watch."""
        self.task = asyncio.create_task(self.run(), name=self.name)
        return self.task

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            by_token = self.held()
            if not by_token:
                continue
            try:
                await self.extend(by_token)
            except self.retry_on as exc:
                self.log.warning("lease_extension_failed", error=describe(exc))
