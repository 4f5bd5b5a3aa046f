"""What operators do and see: requeue, cancel, resolve, suppress, and the outbox's health.

The console, the admin API and the CLI all call these, so an action means the same thing
wherever it is taken, and each is recorded as an event with the operator as the actor.
Verifications follow their messages here as they do in the worker.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, true
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from mailbag.domain.message import Message, normalize_address
from mailbag.domain.states import Status
from mailbag.store import events as event_store
from mailbag.store import outbox as store
from mailbag.store import stats
from mailbag.store import suppressions as suppression_store
from mailbag.store import verifications as verification_store
from mailbag.store.database import READ_ONLY, Dialect
from mailbag.store.outbox import Changed, om
from mailbag.store.plan import run_async

BULK_LIMIT = 10_000


class NotAllowed(Exception):
    """The message is not in a state this action applies to."""


@dataclass(frozen=True)
class Filter:
    """Which messages an operator means (every field optional)."""

    status: Status | None = None
    tenant_id: str | None = None
    to: str | None = None
    template: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None

    def where(self) -> ColumnElement[bool]:
        conditions: list[ColumnElement[bool]] = []
        if self.status is not None:
            conditions.append(om.c.status == self.status.value)
        if self.tenant_id:
            conditions.append(om.c.tenant_id == self.tenant_id)
        if self.to:
            conditions.append(func.lower(om.c.to_address) == self.to.lower())
        if self.template:
            conditions.append(om.c.template_name == self.template)
        if self.created_from is not None:
            conditions.append(om.c.created_at >= self.created_from)
        if self.created_to is not None:
            conditions.append(om.c.created_at < self.created_to)
        return and_(true(), *conditions)


@dataclass
class Health:
    """The numbers on the console's first page, `mailbag stats` and the alerts."""

    counts: dict[str, int]
    oldest_due_age_seconds: float | None
    sent_per_5_minutes: list[int]  # the last hour, oldest bucket first
    attempts_last_hour: dict[str, int]  # how attempts ended: sent, retrying, failed, ...
    unknown_oldest: list[dict[str, Any]] = field(default_factory=list)
    unmatched_provider_events: int = 0
    suppressions: int = 0

    @property
    def provider_error_rate(self) -> float | None:
        total = sum(self.attempts_last_hour.values())
        if not total:
            return None
        return 1 - self.attempts_last_hour.get(Status.SENT.value, 0) / total

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "oldest_due_age_seconds": self.oldest_due_age_seconds,
            "sent_per_5_minutes": self.sent_per_5_minutes,
            "attempts_last_hour": self.attempts_last_hour,
            "provider_error_rate": self.provider_error_rate,
            "unknown_oldest": self.unknown_oldest,
            "unmatched_provider_events": self.unmatched_provider_events,
            "suppressions": self.suppressions,
        }


class Operations:
    def __init__(self, engine: AsyncEngine, dialect: Dialect, *, default_attempts: int) -> None:
        self.engine, self.dialect, self.default_attempts = engine, dialect, default_attempts

    async def _follow(
        self, conn: AsyncConnection, changed: list[Changed[Any]], now: datetime, actor: str
    ) -> None:
        await run_async(
            conn, verification_store.follow_messages(self.dialect, changed, now=now, actor=actor)
        )

    async def requeue(
        self,
        *,
        message_ids: list[uuid.UUID] | None = None,
        where: Filter | None = None,
        now: datetime,
        actor: str,
    ) -> list[Changed[Message]]:
        """Send unknown or dead messages again: by id, or every one a filter matches."""
        if message_ids is None and where is None:
            raise ValueError("requeue needs ids or a filter")
        condition = (
            om.c.id.in_(message_ids) if message_ids is not None else (where or Filter()).where()
        )
        async with self.engine.begin() as conn:
            changed = await run_async(
                conn,
                store.requeue(
                    self.dialect,
                    where=condition,
                    now=now,
                    actor=actor,
                    extra_attempts=self.default_attempts,
                    limit=BULK_LIMIT,
                ),
            )
            await self._follow(conn, changed, now, actor)
        return changed

    async def cancel(
        self, *, message_id: uuid.UUID, now: datetime, actor: str, tenant_id: str | None = None
    ) -> Changed[Message]:
        condition = om.c.id == message_id
        if tenant_id is not None:
            condition = and_(condition, om.c.tenant_id == tenant_id)
        async with self.engine.begin() as conn:
            changed = await run_async(
                conn, store.cancel(self.dialect, where=condition, now=now, actor=actor)
            )
        if not changed:
            raise NotAllowed("only pending messages can be cancelled")
        return changed[0]

    async def resolve(
        self,
        *,
        message_id: uuid.UUID,
        sent: bool,
        evidence: str,
        now: datetime,
        actor: str,
        provider_message_id: str | None = None,
    ) -> Changed[Message]:
        """Settle an unknown message from evidence an operator (or the reconciler) has."""
        if not evidence.strip():
            raise ValueError("say what the evidence is")
        async with self.engine.begin() as conn:
            changed = await run_async(
                conn,
                store.resolve(
                    self.dialect,
                    message_id=message_id,
                    sent=sent,
                    now=now,
                    actor=actor,
                    evidence=evidence,
                    provider_message_id=provider_message_id,
                ),
            )
            await self._follow(conn, changed, now, actor)
        if not changed:
            raise NotAllowed("only unknown messages can be resolved")
        return changed[0]

    async def message(self, message_id: uuid.UUID) -> tuple[Any, list[Any], list[Any]] | None:
        """A message (any tenant), its transitions and the provider events matched to it."""
        async with self.engine.connect() as conn:
            message = await run_async(conn, store.get(message_id))
            if message is None:
                return None
            history = await run_async(conn, store.events(message_id))
            provider_events = await run_async(conn, event_store.for_message(message))
        return message, history, provider_events

    async def messages(
        self, where: Filter, *, limit: int, before: uuid.UUID | None
    ) -> tuple[list[Any], bool]:
        async with self.engine.connect() as conn:
            return await run_async(
                conn,
                store.page(
                    tenant_id=where.tenant_id,
                    status=where.status,
                    to=where.to,
                    template=where.template,
                    before=before,
                    limit=limit,
                    created_from=where.created_from,
                    created_to=where.created_to,
                ),
            )

    async def suppress(
        self,
        *,
        tenant_id: str,
        email: str,
        now: datetime,
        reason: str = "manual",
        detail: str | None = None,
    ) -> bool:
        address = normalize_address(email)
        async with self.engine.begin() as conn:
            return await run_async(
                conn,
                suppression_store.add(
                    self.dialect,
                    tenant_id=tenant_id,
                    email=address,
                    reason=reason,
                    now=now,
                    detail=detail,
                ),
            )

    async def unsuppress(self, *, tenant_id: str, email: str) -> bool:
        async with self.engine.begin() as conn:
            return await run_async(conn, suppression_store.remove(tenant_id=tenant_id, email=email))

    async def suppressions(
        self, *, tenant_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[suppression_store.Suppression]:
        async with self.engine.connect() as conn:
            return await run_async(
                conn, suppression_store.listing(tenant_id=tenant_id, limit=limit, offset=offset)
            )

    async def health(self, now: datetime) -> Health:
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(**READ_ONLY)
            return await health(conn, now)


async def health(conn: AsyncConnection, now: datetime) -> Health:
    counts = await run_async(conn, store.count_by_status())
    oldest_due = await run_async(conn, stats.oldest_due(now))
    unknown = await run_async(conn, stats.oldest_unknown())
    return Health(
        counts={s.value: counts.get(s.value, 0) for s in Status},
        oldest_due_age_seconds=max(0.0, (now - oldest_due).total_seconds()) if oldest_due else None,
        sent_per_5_minutes=await run_async(conn, stats.sent_per_bucket(now)),
        attempts_last_hour=await run_async(conn, stats.attempt_endings(now - timedelta(hours=1))),
        unknown_oldest=[
            {
                "id": str(r.id),
                "tenant_id": r.tenant_id,
                "to": r.to_address,
                "since": r.updated_at.isoformat(),
                "claimed_by": r.claimed_by,
            }
            for r in unknown
        ],
        unmatched_provider_events=await run_async(conn, event_store.unmatched_count()),
        suppressions=await run_async(conn, suppression_store.count()),
    )
