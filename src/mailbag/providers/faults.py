"""`faults`: a provider for an application's own tests (`mailbag.testing.faults`) that fails
the way real providers do, around an inner provider that takes what it accepts (default:
`capture`), so a test sees `unknown`, retries and failover happen.

Which fault comes next is domain.faults' Plan (a script, then rates, from a seeded
random.Random). Each fault is the outcome a real provider's failure comes to (REFUSALS, and
TIMED_OUT):

- `timeout_after_accept`: the inner provider took the email, then no answer came:
  Ambiguous. It *was* sent: `find_sent` finds it and `events()` reports it, so
  reconciliation settles the message as sent, and nothing sends it again.
- `throttle`: 429 before taking anything (Throttled); `server_error`: a 5xx before taking
  anything, and `refuse_connection` (Deferred about the provider): nothing was sent.
- `reject`, `defer`: one email refused for good (Rejected), or for now for its own sake
  (Deferred: a full mailbox, its attempt spent); `batch_partial` (a rate) refuses some
  emails of a batch that way and takes the others.

A timeout of a request of one email is keyed (Ambiguous.keyed) and, when the provider
deduplicates (`idempotency_window`, default the inner provider's), a retry under the same
key is answered with the first send's id without the inner provider taking it again, as a
real provider's idempotency key does. It keeps every email it took, for `find_sent` and
`events()`, for as long as it lives: it is for tests.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, cast

from mailbag.compose import OutgoingEmail
from mailbag.domain import delivery
from mailbag.domain.events import (
    BounceType,
    EventKind,
    EventSource,
    ProviderEvent,
    keyed_event,
    normalize_recipient,
)
from mailbag.domain.faults import Fault, Plan, parse_rates, parse_script
from mailbag.providers import create, register
from mailbag.providers.base import Capabilities, Provider, Sighting
from mailbag.providers.memory import CaptureProvider

if TYPE_CHECKING:
    from mailbag.domain.message import Message
    from mailbag.settings import Settings

# The events a test reads from this provider name it: not one of the webhooks mailbag
# serves (domain.events.EventSource), as they come from the test, not over HTTP.
SOURCE = cast("EventSource", "faults")
TIMED_OUT = "faults: read timeout after the request was sent (it may have been accepted)"
# What it answers for a fault that takes nothing.
REFUSALS: Mapping[Fault, delivery.SendOutcome] = {
    Fault.THROTTLE: delivery.Throttled("faults: 429 Too Many Requests"),
    Fault.SERVER_ERROR: delivery.Deferred("faults: 503 Service Unavailable", provider_fault=True),
    Fault.REFUSE_CONNECTION: delivery.Deferred("faults: connection refused", provider_fault=True),
    Fault.REJECT: delivery.Rejected("faults: 550 5.1.1 the recipient does not exist"),
    # The message's own: an attempt is spent, as for greylisting or a full mailbox.
    Fault.DEFER: delivery.Deferred("faults: 452 4.2.2 mailbox full, try later"),
}
TAKING = frozenset({Fault.ACCEPT, Fault.TIMEOUT_AFTER_ACCEPT})  # the inner provider takes it
BOUNCE_DETAIL = "faults: 550 5.1.1 the mailbox does not exist"
DEFAULT_BATCH_SIZE = 50


@dataclass(frozen=True)
class Answer:
    """What the provider answered for one email of one request, in the order it did."""

    message_id: uuid.UUID
    attempt: int
    fault: Fault


@dataclass(frozen=True)
class Taken:
    """An email the inner provider accepted (answered or not), with the id it gave."""

    email: OutgoingEmail
    provider_message_id: str


class FaultProvider:
    name = "faults"
    capabilities = Capabilities(utf8_local_part=True)  # what capture, the default, carries

    def __init__(
        self,
        *,
        rates: str | Mapping[str, float] | None = None,
        script: str | Iterable[str] | None = None,
        seed: int | None = None,
        inner: Provider | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        idempotency_window: timedelta | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be 1 or more")
        self.inner: Provider = inner if inner is not None else CaptureProvider()
        rng = random.Random(seed)
        self.plan = Plan(parse_rates(rates), parse_script(script), rng)
        self._events_rng = random.Random(rng.random())  # its own: events() moves no answer
        self.max_batch_size = batch_size
        self.idempotency_window = idempotency_window or self.inner.idempotency_window
        self.answered: list[Answer] = []
        self.taken: list[Taken] = []
        self._by_key: dict[str, str] = {}  # a deduplicated key -> the id it was given
        self._bounces: dict[tuple[str, str], bool] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> FaultProvider:
        return cls(
            rates=settings.faults_rates,
            script=settings.faults_script,
            seed=settings.faults_seed,
            inner=create(settings.faults_inner, settings),
            batch_size=settings.faults_batch_size,
        )

    # --- sending ---------------------------------------------------------------------------

    async def send(self, email: OutgoingEmail) -> delivery.SendOutcome:
        (outcome,) = await self._request([email])
        return outcome

    async def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[delivery.SendOutcome]:
        return await self._request(list(emails))

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def _request(self, emails: list[OutgoingEmail]) -> list[delivery.SendOutcome]:
        """One request: the plan's answer for each email; the inner provider takes those
        that are accepted (or time out after it took them)."""
        answers = list(zip(emails, self.plan.answers(len(emails)), strict=True))
        self.answered += [Answer(e.message_id, e.attempt, f) for e, f in answers]
        took = await self._hand_in([e for e, f in answers if f in TAKING])
        keyed = len(emails) == 1  # a batch carries no key of each email's own
        outcomes: list[delivery.SendOutcome] = []
        for email, fault in answers:
            answer = took.get(email.message_id)
            if answer is None:
                outcomes.append(REFUSALS[fault])
            elif fault is Fault.TIMEOUT_AFTER_ACCEPT and isinstance(answer, delivery.Accepted):
                outcomes.append(delivery.Ambiguous(TIMED_OUT, keyed=keyed))
            else:
                outcomes.append(answer)  # the inner provider's own (it may refuse, too)
        return outcomes

    async def _hand_in(self, emails: list[OutgoingEmail]) -> dict[uuid.UUID, delivery.SendOutcome]:
        """The inner provider's answer for each email (by message id), in requests of its
        batch size; a key this provider already took is answered as before, not sent."""
        answers: dict[uuid.UUID, delivery.SendOutcome] = {}
        fresh = []
        for email in emails:
            known = self._by_key.get(email.idempotency_key)
            if known is not None:
                answers[email.message_id] = delivery.Accepted(known)
            else:
                fresh.append(email)
        size = max(self.inner.max_batch_size, 1)
        for start in range(0, len(fresh), size):
            chunk = fresh[start : start + size]
            outcomes = (
                [await self.inner.send(chunk[0])]
                if len(chunk) == 1
                else await self.inner.send_batch(chunk)
            )
            for email, outcome in zip(chunk, outcomes, strict=True):
                answers[email.message_id] = outcome
                if isinstance(outcome, delivery.Accepted):
                    self.taken.append(Taken(email, outcome.provider_message_id))
                    if self.idempotency_window:
                        self._by_key[email.idempotency_key] = outcome.provider_message_id
        return answers

    # --- what it knows of what it took -----------------------------------------------------

    async def find_sent(self, message: Message, rfc_message_id: str) -> list[Sighting]:
        """Its record of each time it took this message (reconciliation's lookup)."""
        return [
            Sighting(t.provider_message_id, t.email.message_id, None)
            for t in self.taken
            if t.email.message_id == message.id
        ]

    def events(
        self,
        *,
        bounce: float = 0.0,
        bounce_to: Collection[str] = (),
        duplicate: float = 0.0,
        shuffle: bool = False,
    ) -> list[ProviderEvent]:
        """What a webhook would report of every email taken so far, each recipient's:
        `accepted`, then `delivered`, or a hard `bounced` for the addresses in `bounce_to`
        and a `bounce` share of the others (drawn once each: asking again tells the same).
        `duplicate`: that share of the events comes twice, as providers resend;
        `shuffle`: in any order, as webhooks arrive. Hand them to
        `mailbag.testing.ingest_events`, the webhooks' own door."""
        bouncing = {address.lower() for address in bounce_to}
        found: list[ProviderEvent] = []
        for taken in self.taken:
            for recipient in taken.email.envelope_recipients:
                key = (taken.provider_message_id, recipient)
                if key not in self._bounces:
                    drawn = self._events_rng.random() < bounce
                    self._bounces[key] = recipient.lower() in bouncing or drawn
                found += _reported(taken, recipient, bounced=self._bounces[key])
        found += [e for e in found if self._events_rng.random() < duplicate]
        if shuffle:
            self._events_rng.shuffle(found)
        return found


def _reported(taken: Taken, recipient: str, *, bounced: bool) -> list[ProviderEvent]:
    """One recipient's events: taken when the email was dated, the verdict a second on."""
    at = taken.email.date.astimezone(UTC)
    verdict = EventKind.BOUNCED if bounced else EventKind.DELIVERED
    return [
        _event(taken, recipient, EventKind.ACCEPTED, at),
        _event(taken, recipient, verdict, at + timedelta(seconds=1)),
    ]


def _event(taken: Taken, recipient: str, kind: EventKind, at: datetime) -> ProviderEvent:
    address = normalize_recipient(recipient)
    bounced = kind is EventKind.BOUNCED
    raw = {
        "event": kind.value,
        "message_id": str(taken.email.message_id),
        "provider_message_id": taken.provider_message_id,
        "recipient": address,
    }
    return keyed_event(
        SOURCE,
        kind.value,
        kind,
        BounceType.HARD if bounced else None,
        at,
        recipient=address,
        provider_message_id=taken.provider_message_id,
        message_id=taken.email.message_id,
        content=(kind.value, taken.provider_message_id),
        detail=BOUNCE_DETAIL if bounced else None,
        raw=raw,
    )


register("faults")(FaultProvider.from_settings)
