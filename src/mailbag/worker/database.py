"""Every database call the worker makes, and nothing else of the store: the worker sees
claims, decisions and results, never SQL, plans or connections.

- Each call is one short transaction, bounded by the database timeout: a database that
  does not answer in time is `DatabaseTimeout` (an OSError, one of `DB_ERRORS`).
- A finalize writes every decision of a batch in one transaction, each claim's under its
  own token (the store moves the verifications that follow their email in it too).
- A finalize given up on after its COMMIT left is retried by the writer: the retry finds
  the rows finalized and reports them stale. Noisy, never wrong. A claim given up on the
  same way leaves rows nobody sends: the sweep makes them `unknown`, as for a connection
  lost during that COMMIT. Never a duplicate; the window is one round trip.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag.clock import Clock
from mailbag.domain.message import Message
from mailbag.store import dispatch
from mailbag.store.database import Dialect, dialect_of, within
from mailbag.store.dispatch import Claim, Finalized
from mailbag.store.enqueue import NOTIFY_CHANNEL
from mailbag.store.message_transitions import Changed
from mailbag.store.plan import run_async
from mailbag.worker.ledger import Decided

__all__ = ["Finalized", "WorkerDatabase", "Written"]

Written = list[tuple[list[Decided], Finalized]]  # each claim's decisions, and what became of them


class WorkerDatabase:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        worker_id: str,
        provider: str,
        lease: timedelta,
        timeout: float,
        clock: Clock,
    ) -> None:
        self.engine = engine
        self.dialect: Dialect = dialect_of(engine.url)
        self.worker_id, self.provider = worker_id, provider
        self.lease, self.timeout, self.clock = lease, timeout, clock

    async def claim(self, limit: int) -> Claim:
        return await within(self.timeout, self._claim(limit))

    async def _claim(self, limit: int) -> Claim:
        async with self.engine.begin() as conn:
            return await run_async(
                conn,
                dispatch.claim(
                    worker_id=self.worker_id,
                    now=self.clock(),
                    lease=self.lease,
                    limit=limit,
                ),
            )

    async def finalize(self, batch: Sequence[Decided]) -> Written:
        """Write a batch of decisions; each claim's items with what the store made of them."""
        by_token: dict[uuid.UUID, list[Decided]] = defaultdict(list)
        for item in batch:
            by_token[item.token].append(item)
        return await within(self.timeout, self._finalize(by_token))

    async def _finalize(self, by_token: Mapping[uuid.UUID, list[Decided]]) -> Written:
        async with self.engine.begin() as conn:
            now = self.clock()
            results: Written = []
            for token, items in by_token.items():
                finalized = await run_async(
                    conn,
                    dispatch.finalize(
                        token=token,
                        decisions={i.message.id: i.decision for i in items},
                        now=now,
                        actor=self.worker_id,
                        provider=self.provider,
                    ),
                )
                results.append((items, finalized))
        return results

    async def extend_leases(self, by_token: Mapping[uuid.UUID, list[uuid.UUID]]) -> None:
        await within(self.timeout, self._extend_leases(by_token))

    async def _extend_leases(self, by_token: Mapping[uuid.UUID, list[uuid.UUID]]) -> None:
        async with self.engine.begin() as conn:
            for token, ids in by_token.items():
                await run_async(
                    conn,
                    dispatch.extend_lease(token=token, ids=ids, now=self.clock(), lease=self.lease),
                )

    async def sweep(self) -> list[Changed[Message]]:
        """Every expired lease (anyone's) made `unknown`."""
        return await within(self.timeout, self._sweep())

    async def _sweep(self) -> list[Changed[Message]]:
        async with self.engine.begin() as conn:
            return await run_async(
                conn, dispatch.sweep_expired(now=self.clock(), actor=self.worker_id)
            )

    async def expired_again(self, message_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Those of `message_ids` whose lease had expired before (a worker keeps dying)."""
        return await within(self.timeout, self._expired_again(message_ids))

    async def _expired_again(self, message_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        async with self.engine.connect() as conn:
            return await run_async(conn, dispatch.expired_before(message_ids))

    def can_listen(self) -> bool:
        return self.dialect == "postgresql"

    async def listen(self, url: str, on_notify: Callable[[], None], log: Any) -> None:
        """Call `on_notify` at every enqueue's NOTIFY, reconnecting as needed (PostgreSQL)."""
        from mailbag.store.listen import listen

        await listen(url, NOTIFY_CHANNEL, on_notify, log, self.timeout)
