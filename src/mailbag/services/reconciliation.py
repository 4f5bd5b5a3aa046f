"""Provider events in, ambiguity out.

`ingest` stores webhook events (once each: providers resend), matches them to messages,
suppresses addresses that hard-bounced or complained, and settles `unknown` messages the
events speak for. `Reconciler` goes the other way round: for each `unknown` message it
looks for evidence (stored events, then the provider's own lookup API where one exists);
with none after a while it flags the message for an operator. Every conclusion is an
event whose actor is `reconciler`. A message is never sent again to find out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from mailbag import log, metrics
from mailbag.compose import rfc_message_id
from mailbag.domain.events import EventKind, ProviderEvent, kind_proves_acceptance, suppresses
from mailbag.domain.message import Filter, Message, ascii_address
from mailbag.domain.states import Status
from mailbag.providers.base import Sighting
from mailbag.store import events as event_store
from mailbag.store import messages as message_store
from mailbag.store import operator
from mailbag.store import suppressions as suppression_store
from mailbag.store.events import StoredEvent
from mailbag.store.session import AsyncDatabase, AsyncSession

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy.ext.asyncio import AsyncEngine

ACTOR = "reconciler"


@runtime_checkable
class FindsSent(Protocol):
    """A provider that can say whether it has a record of sending a message."""

    async def find_sent(self, message: Message, rfc_message_id: str) -> Sequence[Sighting]:
        """The provider's records that may be of this message, each saying whose it is.
        Only a record of this very message (see `own_sighting`) settles it."""
        ...


def own_sighting(message: Message, sightings: Sequence[Sighting]) -> Sighting | None:
    """The first record that is this message's own: it names this message's id and, when
    it names a recipient, this message's recipient. A lookup by recipient or by
    Message-ID can return other messages' records; they prove nothing about this one."""
    for sighting in sightings:
        if sighting.message_id != message.id:
            continue
        if sighting.recipient is not None and own_recipient(message, sighting.recipient) is None:
            continue
        return sighting
    return None


def own_recipient(message: Message, named: str | None) -> str | None:
    """The recipient of this message (To, Cc or Bcc) that an event or record names; when it
    names none, the message's only recipient. None: it names someone else, or it names
    nobody and the message had several recipients, so it cannot say whose it is."""
    envelope = message.all_recipients.envelope
    if named is None:
        return envelope[0] if len(envelope) == 1 else None
    wanted = ascii_address(named).casefold()
    return next((r for r in envelope if ascii_address(r).casefold() == wanted), None)


@dataclass
class Ingested:
    stored: int = 0
    duplicates: int = 0
    unmatched: int = 0
    resolved: int = 0
    suppressed: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def verdict(events: Sequence[StoredEvent | ProviderEvent]) -> tuple[bool, str, str | None] | None:
    """What a message's events prove: (was it accepted, evidence, provider message id)."""
    accepted = [e for e in events if kind_proves_acceptance(e.kind)]
    rejected = [e for e in events if not kind_proves_acceptance(e.kind)]
    if accepted:  # any sign the provider had it beats a later refusal to deliver
        return True, _evidence("provider event", accepted[0]), accepted[0].provider_message_id
    if rejected:
        return (
            False,
            _evidence("provider rejected it:", rejected[0]),
            rejected[0].provider_message_id,
        )
    return None


def _evidence(what: str, event: StoredEvent | ProviderEvent) -> str:
    text = f"{what} {EventKind(event.kind).value} at {event.occurred_at.isoformat()}"
    return f"{text} ({event.detail})" if event.detail else text


async def _settle(
    tx: AsyncSession,
    message: Message,
    accepted: bool,
    evidence: str,
    provider_message_id: str | None,
    now: datetime,
) -> bool:
    changed = await tx.run(
        operator.resolve(
            message_id=message.id,
            sent=accepted,
            now=now,
            actor=ACTOR,
            evidence=evidence,
            provider_message_id=provider_message_id,
        )
    )
    if changed:
        metrics.RECONCILIATIONS.labels("resolved_sent" if accepted else "resolved_failed").inc()
    return bool(changed)


async def ingest(engine: AsyncEngine, events: Sequence[ProviderEvent], now: datetime) -> Ingested:
    """Store, match and act on provider events, all in one transaction."""
    report = Ingested()
    logger = log.get("mailbag.events")
    async with AsyncDatabase(engine).transaction() as tx:
        for event in events:
            metrics.PROVIDER_EVENTS.labels(event.provider, event.kind.value).inc()
            message = await tx.run(event_store.match(event))
            stored = await tx.run(event_store.store(event, message=message, now=now))
            if stored is None:
                report.duplicates += 1
                continue
            report.stored += 1
            if message is None:
                report.unmatched += 1
                metrics.UNMATCHED_EVENTS.labels(event.provider).inc()
                logger.warning(
                    "provider_message_without_matching_transition",
                    provider=event.provider,
                    kind=event.kind.value,
                    provider_message_id=event.provider_message_id,
                )
                continue
            # A bounce or complaint suppresses the recipient it is about, whichever it was.
            recipient = own_recipient(message, event.recipient)
            if (
                suppresses(event)
                and recipient is not None
                and await tx.run(
                    suppression_store.add(
                        tenant_id=message.tenant_id,
                        email=recipient,
                        reason="complaint" if event.kind is EventKind.COMPLAINED else "hard_bounce",
                        detail=event.detail,
                        source_event_id=stored.id,
                        now=now,
                    )
                )
            ):
                report.suppressed += 1
            found = verdict([event])
            if (
                message.status == Status.UNKNOWN
                and found is not None
                and await _settle(tx, message, *found, now)
            ):
                report.resolved += 1
    return report


class Reconciler:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        providers: Mapping[str, Any] | None = None,
        flag_after: timedelta = timedelta(hours=1),
        batch: int = 100,
    ) -> None:
        # By name, as messages record the provider that sent them: a lookup asks that one.
        # (The worker's own mapping, not a copy: tenants' accounts join it as it reads them.)
        self.db, self.providers = AsyncDatabase(engine), providers or {}
        self.flag_after, self.batch = flag_after, batch
        self.log = log.get("mailbag.reconciler")

    async def run_once(self, now: datetime, *, message_domain: str = "localhost") -> Counter[str]:
        outcomes: Counter[str] = Counter()
        async with self.db.connect() as tx:
            unknown, _ = await tx.run(
                message_store.page(Filter(status=Status.UNKNOWN), limit=self.batch)
            )
        for message in unknown:
            outcome = await self._reconcile(message, now, message_domain)
            outcomes[outcome] += 1
        return outcomes

    async def _reconcile(self, message: Message, now: datetime, domain: str) -> str:
        async with self.db.transaction() as tx:
            found = verdict(await tx.run(event_store.for_message(message)))
            if found is not None:
                settled = await _settle(tx, message, *found, now)
                return ("resolved_sent" if found[0] else "resolved_failed") if settled else "gone"
        provider = self.providers.get(message.provider or "")
        if provider is None and len(self.providers) == 1:  # sent before it had a name
            (provider,) = self.providers.values()
        if isinstance(provider, FindsSent):
            try:
                sightings = await provider.find_sent(message, rfc_message_id(message.id, domain))
            except Exception as exc:  # a lookup failure is no evidence either way
                self.log.warning(
                    "provider_lookup_failed", message_id=str(message.id), error=type(exc).__name__
                )
                sightings = []
            own = own_sighting(message, sightings)
            if own is None and sightings:
                self.log.warning(
                    "provider_lookup_found_only_others",
                    message_id=str(message.id),
                    records=len(sightings),
                )
            provider_id = own.provider_message_id if own is not None else None
            if provider_id is not None:
                async with self.db.transaction() as tx:
                    settled = await _settle(
                        tx,
                        message,
                        True,
                        f"provider lookup found {provider_id}",
                        provider_id,
                        now,
                    )
                return "resolved_sent" if settled else "gone"
        if now - message.updated_at >= self.flag_after:
            async with self.db.transaction() as tx:
                flagged = await tx.run(
                    operator.flag(
                        message_id=message.id,
                        now=now,
                        actor=ACTOR,
                        detail=f"no evidence after {self.flag_after}; an operator has to decide",
                    )
                )
            if flagged:
                metrics.RECONCILIATIONS.labels("flagged").inc()
                self.log.warning("unknown_needs_operator", message_id=str(message.id))
                return "flagged"
        return "waiting"
