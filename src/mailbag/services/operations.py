"""What operators do and see: requeue, cancel, resolve, suppress, and the outbox's health.

The console, the admin API and the CLI all call these, so an action means the same thing
wherever it is taken, and each is recorded as an event with the operator as the actor.
Verifications follow their messages by themselves (store.message_transitions).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from mailbag.domain.message import Filter, Message, normalize_address
from mailbag.domain.states import Status
from mailbag.store import events as event_store
from mailbag.store import messages as message_store
from mailbag.store import operator, stats
from mailbag.store import suppressions as suppression_store
from mailbag.store.message_transitions import Changed
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy.ext.asyncio import AsyncEngine

BULK_LIMIT = 10_000


class NotAllowed(Exception):
    """The message is not in a state this action applies to."""


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
        # Only attempts a provider answered: an expired message never reached one.
        total = sum(n for state, n in self.attempts_last_hour.items() if state != Status.EXPIRED)
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
    def __init__(self, engine: AsyncEngine, *, default_attempts: int) -> None:
        self.engine, self.db, self.default_attempts = (
            engine,
            AsyncDatabase(engine),
            default_attempts,
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
        which = Filter(ids=message_ids) if message_ids is not None else where or Filter()
        return await self._change(
            operator.requeue(
                where=which,
                now=now,
                actor=actor,
                extra_attempts=self.default_attempts,
                limit=BULK_LIMIT,
            )
        )

    async def cancel(
        self, *, message_id: uuid.UUID, now: datetime, actor: str, tenant_id: str | None = None
    ) -> Changed[Message]:
        which = Filter(ids=[message_id], tenant_id=tenant_id)
        return await self._one(
            operator.cancel(where=which, now=now, actor=actor),
            refused="only pending messages can be cancelled",
        )

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
        return await self._one(
            operator.resolve(
                message_id=message_id,
                sent=sent,
                now=now,
                actor=actor,
                evidence=evidence,
                provider_message_id=provider_message_id,
            ),
            refused="only unknown messages can be resolved",
        )

    async def _change(self, plan: Plan[list[Changed[Message]]]) -> list[Changed[Message]]:
        """What one operator statement changed, in a transaction of its own."""
        async with self.db.transaction() as tx:
            return await tx.run(plan)

    async def _one(self, plan: Plan[list[Changed[Message]]], *, refused: str) -> Changed[Message]:
        """The message one operator statement changed; NotAllowed(refused) when it changed
        none (the message is not in a state the action applies to)."""
        changed = await self._change(plan)
        if not changed:
            raise NotAllowed(refused)
        return changed[0]

    async def message(self, message_id: uuid.UUID) -> tuple[Any, list[Any], list[Any]] | None:
        """A message (any tenant), its transitions and the provider events matched to it."""
        async with self.db.connect() as tx:
            message = await tx.run(message_store.get(message_id))
            if message is None:
                return None
            history = await tx.run(message_store.events(message_id))
            provider_events = await tx.run(event_store.for_message(message))
        return message, history, provider_events

    async def messages(
        self, where: Filter, *, limit: int, before: uuid.UUID | None
    ) -> tuple[list[Any], bool]:
        async with self.db.connect() as tx:
            return await tx.run(message_store.page(where, limit=limit, before=before))

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
        async with self.db.transaction() as tx:
            return await tx.run(
                suppression_store.add(
                    tenant_id=tenant_id, email=address, reason=reason, now=now, detail=detail
                )
            )

    async def unsuppress(self, *, tenant_id: str, email: str) -> bool:
        async with self.db.transaction() as tx:
            return await tx.run(suppression_store.remove(tenant_id=tenant_id, email=email))

    async def suppressions(
        self, *, tenant_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[suppression_store.Suppression]:
        async with self.db.connect() as tx:
            return await tx.run(
                suppression_store.listing(tenant_id=tenant_id, limit=limit, offset=offset)
            )

    async def health(self, now: datetime) -> Health:
        async with self.db.connect(read_only=True) as tx:
            counts = await tx.run(message_store.count_by_status())
            oldest_due = await tx.run(stats.oldest_due(now))
            unknown = await tx.run(stats.oldest_unknown())
            return Health(
                counts={s.value: counts.get(s.value, 0) for s in Status},
                oldest_due_age_seconds=(
                    max(0.0, (now - oldest_due).total_seconds()) if oldest_due else None
                ),
                sent_per_5_minutes=await tx.run(stats.sent_per_bucket(now)),
                attempts_last_hour=await tx.run(stats.attempt_endings(now - timedelta(hours=1))),
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
                unmatched_provider_events=await tx.run(event_store.unmatched_count()),
                suppressions=await tx.run(suppression_store.count()),
            )
