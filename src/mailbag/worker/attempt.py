"""One send attempt for a chunk of claimed messages: compose, send, classify, decide.

No database and no worker state: what happens is told to a `Progress` as it happens, so
the caller keeps its own books (tests pass a recorder and the in-memory provider).

- A message whose expires_at has come is decided `lapse` (-> expired) at once: never
  composed, never sent.
- A message whose template does not render is decided `Rejected` at once; it never leaves.
- Attachments are composed from `contents`, their bytes by SHA-256, read with the claim.
- Under PROVIDER_RATE the chunk waits for its send slot (a monotonic time), once
  composed, and for this worker's `Pace`, so that sends woken late together (the event
  loop was held up) still leave the rate apart.
- Just before the send, `progress.start` may refuse (the worker is stopping): the chunk is
  handed back unsent as `Disabled`, no attempt spent.
- A provider that raises (a bug in it) may have sent: `Ambiguous`, never keyed, so it is
  never resent blindly. A send cancelled by the end of the shutdown grace is `Ambiguous`
  too (keyed when it went alone), decided before the cancellation goes on.
- Each message is decided exactly once, by `decide` (the domain's rule, and the metric).
- `chunks`: a retry under an ambiguous send's idempotency key goes alone (a batch call
  carries no per-email key, so the provider could not deduplicate it); the rest in chunks
  of the provider's batch size.
- Failover (worker/fleet.py, domain/routing.py): a message its provider surely refused
  (unreachable, an error about itself, disabled, throttled) goes at once, in the same
  attempt, to the next available provider of its route; never after an ambiguous outcome.
  Each decision names the provider whose answer it is.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol, TypeVar

from mailbag import metrics
from mailbag.clock import Clock
from mailbag.compose import OutgoingEmail, compose
from mailbag.domain.delivery import (
    Accepted,
    Ambiguous,
    Attempt,
    Decision,
    Disabled,
    Rejected,
    SendOutcome,
    decide,
    lapse,
)
from mailbag.domain.message import Message
from mailbag.domain.rate import Pace, SendSlot
from mailbag.domain.routing import sure_refusal
from mailbag.domain.states import Action
from mailbag.providers.kit import describe
from mailbag.templates import TemplateError
from mailbag.templates.book import Book
from mailbag.worker.config import WorkerConfig
from mailbag.worker.fleet import Fleet, metric_label

T = TypeVar("T")


class Progress(Protocol):
    def start(self, messages: Sequence[Message]) -> bool:
        """These are about to be sent: may they go? (False hands them back unsent.)"""

    def decided(self, message: Message, outcome: SendOutcome | None, decision: Decision) -> None:
        """What the provider answered for `message` (None: it was not asked, the message
        lapsed), and what follows from it."""


NO_CONTENTS: Mapping[str, bytes] = {}


def _batches(sends: list[T], size: int) -> list[list[T]]:
    step = max(1, size)
    return [sends[i : i + step] for i in range(0, len(sends), step)]


def chunks(messages: Sequence[Message], max_batch_size: int) -> list[Sequence[Message]]:
    keyed: list[Sequence[Message]] = [[m] for m in messages if m.ambiguous_since is not None]
    rest = [m for m in messages if m.ambiguous_since is None]
    size = max(1, max_batch_size)
    return keyed + [rest[i : i + size] for i in range(0, len(rest), size)]


@dataclass(frozen=True)
class Sender:
    fleet: Fleet
    book: Book  # its messages' templates: their pinned versions, the file templates
    config: WorkerConfig
    clock: Clock
    rng: random.Random
    log: Any
    pace: Pace = field(default_factory=Pace)  # this worker's sends, under PROVIDER_RATE
    _series: dict[str, Any] = field(default_factory=dict)

    async def attempt(
        self,
        chunk: Sequence[Message],
        progress: Progress,
        contents: Mapping[str, bytes] = NO_CONTENTS,
        *,
        slot: SendSlot | None = None,
        provider: str | None = None,
    ) -> None:
        """Send `chunk` through `provider` (a name of the fleet's; its only one by default);
        `contents` holds its attachments' bytes by SHA-256; under PROVIDER_RATE not before
        its `slot`, nor closer than the slot's rate to this worker's other sends."""
        name = provider or next(iter(self.fleet.members))
        messages, emails = self._composed(chunk, progress, contents)
        if not messages:
            return
        if slot is not None:
            if (wait := slot.at - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            # Woken late with others: not in one burst (the turn is taken just before the
            # send, with no await between the two).
            # (A time to wait for, not an event: ASYNC110 does not apply.)
            while (wait := self.pace.take(len(messages), slot.rate, time.monotonic())) > 0:  # noqa: ASYNC110
                await asyncio.sleep(wait)
        if not progress.start(messages):  # claimed but never started: no attempt spent
            for message in messages:
                self._decided(progress, message, Disabled("worker shutting down before the send"))
            return
        tried: dict[Any, list[str]] = {}  # by message id: the providers that refused it
        # The chunk goes as it was cut for its provider; what fails over, in the next one's
        # batch size.
        queue = [(name, list(zip(messages, emails, strict=True)))]
        while queue:
            name, group = queue.pop(0)
            moved = await self._send_through(name, group, tried, progress)
            for nxt, sends in moved.items():
                size = self.fleet.members[nxt].max_batch_size
                queue += [(nxt, batch) for batch in _batches(sends, size)]

    def _composed(
        self, chunk: Sequence[Message], progress: Progress, contents: Mapping[str, bytes]
    ) -> tuple[list[Message], list[OutgoingEmail]]:
        """The chunk's emails; a message that lapsed, lacks an attachment's bytes or does not
        render is decided here and left out."""
        now, config = self.clock(), self.config
        messages: list[Message] = []
        emails: list[OutgoingEmail] = []
        for message in chunk:
            lapsed = lapse(message.expires_at, now)
            if lapsed is not None:
                progress.decided(message, None, lapsed)
                continue
            if message.attachments and (missing := self._missing(message, contents)):
                self._decided(progress, message, Rejected(f"attachment {missing!r} is missing"))
                continue
            try:
                email = compose(
                    message,
                    self.book,
                    default_from_email=config.from_email,
                    default_from_name=config.from_name,
                    message_id_domain=config.message_id_domain,
                    now=now,
                    secrets=config.tokens.secrets_for if config.tokens else None,
                    contents=contents,
                    signing=self.fleet.signing_keys,
                    unsubscribe=config.unsubscribe,
                )
            except TemplateError as exc:
                self._decided(progress, message, Rejected(str(exc)))
            else:
                messages.append(message)
                emails.append(email)
        return messages, emails

    async def _send_through(
        self,
        name: str,
        sends: list[tuple[Message, OutgoingEmail]],
        tried: dict[Any, list[str]],
        progress: Progress,
    ) -> dict[str, list[tuple[Message, OutgoingEmail]]]:
        """Send `sends` through `name`; decide each, or hand it on: what goes to which next
        provider (after a sure refusal, to its route's next available one)."""
        provider = self.fleet.members[name]
        emails = [email for _, email in sends]
        started = time.perf_counter()
        try:
            if len(emails) == 1:
                outcomes = [await provider.send(emails[0])]
            else:
                outcomes = list(await provider.send_batch(emails))
            self._seconds(name).observe(time.perf_counter() - started)
        except asyncio.CancelledError:
            # The grace period ran out mid-send: whether it left is unknown.
            interrupted = Ambiguous("send interrupted by shutdown", keyed=len(emails) == 1)
            for message, _ in sends:
                self._decided(progress, message, interrupted, name)
            raise
        except Exception as exc:  # a provider bug: it may have sent, so never resend blindly
            self.log.exception("provider_crashed", provider=name)
            outcomes = [Ambiguous(f"provider raised {describe(exc)}", keyed=False)] * len(emails)
        moved: dict[str, list[tuple[Message, OutgoingEmail]]] = {}
        for (message, email), outcome in zip(sends, outcomes, strict=True):
            self.fleet.note(name, outcome)
            nxt = None
            if sure_refusal(outcome):
                refused_by = tried.setdefault(message.id, [])
                refused_by.append(name)
                nxt = self.fleet.choose(message, self.clock(), refused_by)
            if nxt is None:
                self._decided(progress, message, outcome, name)
                continue
            self.log.warning(
                "provider_failover",
                message_id=str(message.id),
                provider=name,
                to=nxt,
                error=getattr(outcome, "error", None) or getattr(outcome, "reason", None),
            )
            moved.setdefault(nxt, []).append((message, email))
        return moved

    def waiting(self, message: Message) -> Decision:
        """A claimed message none of whose providers is available now: it waits for the
        first of them (`wait`)."""
        now = self.clock()
        why, until = self.fleet.why_waiting(message, now), self.fleet.wait_until(message, now)
        return self.wait(message, why, until)

    def wait(self, message: Message, why: str, until: datetime) -> Decision:
        """A claimed message that waits, unsent and with no attempt spent, until `until`
        (for its providers, for its recipient domain's slot); dead once in the queue longer
        than QUEUE_LIFETIME, expired past its expires_at."""
        now = self.clock()
        lapsed = lapse(message.expires_at, now)
        if lapsed is not None:
            return lapsed
        if now - message.created_at >= self.config.queue_lifetime:
            lifetime = self.config.queue_lifetime.total_seconds() / 3600
            return Decision(
                Action.BURY,
                error=f"{why} (in the queue longer than QUEUE_LIFETIME, {lifetime:g} h)",
            )
        return Decision(Action.RELEASE, error=why, next_attempt_at=until)

    def _seconds(self, name: str) -> Any:
        """The provider's series, looked up once (`labels` costs a lock and a dict)."""
        if name not in self._series:
            self._series[name] = metrics.PROVIDER_SECONDS.labels(metric_label(name))
        return self._series[name]

    @staticmethod
    def _missing(message: Message, contents: Mapping[str, bytes]) -> str | None:
        """The first attachment whose bytes were not read (the store keeps every one a
        message refers to, so this is a bug: the message fails, it is never resent)."""
        return next((a.filename for a in message.attachments if a.sha256 not in contents), None)

    def _decided(
        self, progress: Progress, message: Message, outcome: SendOutcome, name: str | None = None
    ) -> None:
        progress.decided(message, outcome, self.decide(message, outcome, name))

    def decide(self, message: Message, outcome: SendOutcome, name: str | None = None) -> Decision:
        """The domain's decision (domain.delivery.decide) for `outcome`, an answer of the
        provider `name` (None: no provider was asked), which the decision then names."""
        provider = self.fleet.members[name] if name is not None else None
        if not isinstance(outcome, Accepted) and name is not None:
            error_class = type(outcome).__name__.lower()
            metrics.PROVIDER_ERRORS.labels(metric_label(name), error_class).inc()
        decision = decide(
            outcome,
            Attempt(
                message.attempt,
                message.max_attempts,
                message.claimed_at or self.clock(),
                message.ambiguous_since,
                created_at=message.created_at,
            ),
            now=self.clock(),
            policy=self.config.policy,
            key_window=provider.idempotency_window if provider is not None else None,
            rng=self.rng,
            queue_lifetime=self.config.queue_lifetime,
        )
        # (One provider: the finalize names it anyway, and a replace costs microseconds.)
        alone = self.fleet.alone
        return replace(decision, provider=name) if name is not None and not alone else decision
