"""Housekeeping: old rows go and stale ones expire, in short transactions.

Two callers run the same chunks: an operator's `mailbag purge` (sync, `purge`) and the
elected scheduler of the worker fleet (worker/scheduler.py), which runs them on the
worker's async engine so its event loop never waits on them (`purge_finished`,
`drop_expired_records`, `expire_verifications`).

Each chunk is its own transaction of at most CHUNK rows, repeated until a chunk comes back
short, so a large purge never holds locks for long. Every chunk is safe to run beside
another replica running the same one (it deletes or moves only rows its guard still
matches). `unknown` messages are never purged.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

from mailbag.services.tenants import tenant_id_of
from mailbag.store import attachments, domain_rates, idempotency, operator, verifications
from mailbag.store import tenant_retention as retention_store
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase, Database

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

    from mailbag.settings import Settings

CHUNK = 1000
RETENTION_MAX_DAYS = 36500.0  # a tenant's PURGE_AFTER_DAYS: a hundred years at most
ACTOR = "scheduler"  # the actor of the events these chunks write

Chunk = Callable[[], Plan[int]]  # one short transaction's work: how many rows it took


class Purged(NamedTuple):
    messages: int
    records: int  # expired idempotency records
    attachments: int  # attachment contents no message referenced any more


class InvalidRetention(ValueError):
    """A tenant's PURGE_AFTER_DAYS that is not a number of days; nothing was written."""


def finished_messages(
    older_than: datetime, *, tenant_id: str | None = None, other_than: frozenset[str] = frozenset()
) -> Chunk:
    return lambda: operator.purge(
        older_than=older_than, limit=CHUNK, tenant_id=tenant_id, other_than=other_than
    )


def expired_records(now: datetime) -> Chunk:
    return lambda: idempotency.purge_expired(now, limit=CHUNK)


def unused_attachments() -> Chunk:
    return lambda: attachments.purge_unreferenced(limit=CHUNK)


def stale_verifications(now: datetime) -> Chunk:
    return lambda: verifications.expire_stale(now, actor=ACTOR, limit=CHUNK)


def purge(engine: Engine, *, older_than: datetime, now: datetime) -> Purged:
    """Delete finished messages last changed before `older_than`, every idempotency record
    expired by `now`, then the attachments no message references any more (those of the
    purged messages, unless another message carries the same bytes)."""
    messages = _in_chunks(engine, finished_messages(older_than))
    records = _in_chunks(engine, expired_records(now))
    unused = _in_chunks(engine, unused_attachments())
    return Purged(messages, records, unused)


async def purge_finished(engine: AsyncEngine, *, older_than: datetime) -> dict[str, int]:
    """`purge`'s messages and then their unused attachments, on an async engine."""
    messages = await _in_chunks_async(engine, finished_messages(older_than))
    unused = await _in_chunks_async(engine, unused_attachments())
    return {"messages": messages, "attachments": unused}


async def purge_by_retention(
    engine: AsyncEngine, *, now: datetime, default_days: float
) -> dict[str, int]:
    """The scheduler's purge: each tenant's finished messages older than its own
    PURGE_AFTER_DAYS, or the setting's (`default_days`) for a tenant without one (0:
    never), then the attachments no message carries any more."""
    async with AsyncDatabase(engine).connect(read_only=True) as session:
        own = await session.run(retention_store.all_days())
    messages = 0
    for tenant_id, days in sorted(own.items()):
        if days > 0:
            older_than = now - timedelta(days=days)
            messages += await _in_chunks_async(
                engine, finished_messages(older_than, tenant_id=tenant_id)
            )
    if default_days > 0:
        older_than = now - timedelta(days=default_days)
        messages += await _in_chunks_async(
            engine, finished_messages(older_than, other_than=frozenset(own))
        )
    unused = await _in_chunks_async(engine, unused_attachments())
    return {"messages": messages, "attachments": unused}


def checked_days(days: float) -> float:
    if not 0 <= days <= RETENTION_MAX_DAYS or days != days:  # days != days: NaN
        raise InvalidRetention(f"purge_after_days must be 0 to {RETENTION_MAX_DAYS:g} days")
    return days


async def set_retention(
    engine: AsyncEngine, tenant: str, purge_after_days: float | None, *, now: datetime
) -> str:
    """A tenant's own PURGE_AFTER_DAYS (None: back to the setting); the tenant's id.
    InvalidRetention or UnknownTenant before anything is written."""
    if purge_after_days is not None:
        checked_days(purge_after_days)
    async with AsyncDatabase(engine).transaction() as tx:
        tenant_id = await tx.run(tenant_id_of(tenant))
        if purge_after_days is None:
            await tx.run(retention_store.remove(tenant_id=tenant_id))
        else:
            await tx.run(
                retention_store.put(tenant_id=tenant_id, purge_after_days=purge_after_days, now=now)
            )
    return tenant_id


async def retention(engine: AsyncEngine) -> dict[str, float]:
    """Each tenant's own PURGE_AFTER_DAYS, by tenant id."""
    async with AsyncDatabase(engine).connect(read_only=True) as session:
        return await session.run(retention_store.all_days())


async def drop_expired_records(engine: AsyncEngine, now: datetime) -> dict[str, int]:
    return {"records": await _in_chunks_async(engine, expired_records(now))}


async def check_sender_domains(
    engine: AsyncEngine, settings: Settings, now: datetime
) -> dict[str, int]:
    """Re-check the sender domains whose last check is DOMAIN_CHECK_EVERY_SECONDS old."""
    from mailbag.services.sender_domains import SenderDomains

    every = timedelta(seconds=settings.domain_check_every_seconds)
    return {"domains": await SenderDomains(engine, settings).check_due(now=now, every=every)}


async def forget_quiet_domains(engine: AsyncEngine, now: datetime) -> dict[str, int]:
    """Drop the send schedules of recipient domains that stopped deferring a day ago."""
    return {"domains": await _in_chunks_async(engine, lambda: domain_rates.forget(limit=CHUNK))}


async def expire_verifications(engine: AsyncEngine, now: datetime) -> dict[str, int]:
    return {"verifications": await _in_chunks_async(engine, stale_verifications(now))}


def _in_chunks(engine: Engine, chunk: Chunk) -> int:
    db, total = Database(engine), 0
    while True:
        with db.transaction() as tx:
            done = tx.run(chunk())
        total += done
        if done < CHUNK:
            return total


async def _in_chunks_async(engine: AsyncEngine, chunk: Chunk) -> int:
    # The twin of _in_chunks: the same plans, awaited (each await lets the loop run).
    db, total = AsyncDatabase(engine), 0
    while True:
        async with db.transaction() as tx:
            done = await tx.run(chunk())
        total += done
        if done < CHUNK:
            return total
