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
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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
from mailbag.providers.base import Provider
from mailbag.providers.kit import describe
from mailbag.templates import Catalog, TemplateError
from mailbag.worker.config import WorkerConfig


class Progress(Protocol):
    def start(self, messages: Sequence[Message]) -> bool:
        """These are about to be sent: may they go? (False hands them back unsent.)"""

    def decided(self, message: Message, outcome: SendOutcome | None, decision: Decision) -> None:
        """What the provider answered for `message` (None: it was not asked, the message
        lapsed), and what follows from it."""


NO_CONTENTS: Mapping[str, bytes] = {}


def chunks(messages: Sequence[Message], max_batch_size: int) -> list[Sequence[Message]]:
    keyed: list[Sequence[Message]] = [[m] for m in messages if m.ambiguous_since is not None]
    rest = [m for m in messages if m.ambiguous_since is None]
    size = max(1, max_batch_size)
    return keyed + [rest[i : i + size] for i in range(0, len(rest), size)]


@dataclass(frozen=True)
class Sender:
    provider: Provider
    catalog: Catalog
    config: WorkerConfig
    clock: Clock
    rng: random.Random
    log: Any
    pace: Pace = field(default_factory=Pace)  # this worker's sends, under PROVIDER_RATE

    async def attempt(
        self,
        chunk: Sequence[Message],
        progress: Progress,
        contents: Mapping[str, bytes] = NO_CONTENTS,
        *,
        slot: SendSlot | None = None,
    ) -> None:
        """Send `chunk`; `contents` holds its attachments' bytes by SHA-256; under
        PROVIDER_RATE not before its `slot`, nor closer than the slot's rate to this
        worker's other sends."""
        now = self.clock()
        config = self.config
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
                    self.catalog,
                    default_from_email=config.from_email,
                    default_from_name=config.from_name,
                    message_id_domain=config.message_id_domain,
                    now=now,
                    secrets=config.tokens.secrets_for if config.tokens else None,
                    contents=contents,
                )
            except TemplateError as exc:
                self._decided(progress, message, Rejected(str(exc)))
            else:
                messages.append(message)
                emails.append(email)
        if not messages:
            return
        if slot is not None:
            if (wait := slot.at - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            if (wait := self.pace.wait(len(messages), slot.rate, time.monotonic())) > 0:
                await asyncio.sleep(wait)  # woken late with others: not in one burst
        if not progress.start(messages):  # claimed but never started: no attempt spent
            for message in messages:
                self._decided(progress, message, Disabled("worker shutting down before the send"))
            return
        outcomes: Sequence[SendOutcome]
        started = time.perf_counter()
        try:
            if len(emails) == 1:
                outcomes = [await self.provider.send(emails[0])]
            else:
                outcomes = await self.provider.send_batch(emails)
            self._provider_seconds.observe(time.perf_counter() - started)
        except asyncio.CancelledError:
            # The grace period ran out mid-send: whether it left is unknown.
            interrupted = Ambiguous("send interrupted by shutdown", keyed=len(messages) == 1)
            for message in messages:
                self._decided(progress, message, interrupted)
            raise
        except Exception as exc:  # a provider bug: it may have sent, so never resend blindly
            self.log.exception("provider_crashed", provider=self.provider.name)
            outcomes = [Ambiguous(f"provider raised {describe(exc)}", keyed=False)] * len(emails)
        for message, outcome in zip(messages, outcomes, strict=True):
            self._decided(progress, message, outcome)

    @functools.cached_property
    def _provider_seconds(self) -> Any:
        """This provider's series, looked up once (`labels` costs a lock and a dict)."""
        return metrics.PROVIDER_SECONDS.labels(self.provider.name)

    @staticmethod
    def _missing(message: Message, contents: Mapping[str, bytes]) -> str | None:
        """The first attachment whose bytes were not read (the store keeps every one a
        message refers to, so this is a bug: the message fails, it is never resent)."""
        return next((a.filename for a in message.attachments if a.sha256 not in contents), None)

    def _decided(self, progress: Progress, message: Message, outcome: SendOutcome) -> None:
        progress.decided(message, outcome, self.decide(message, outcome))

    def decide(self, message: Message, outcome: SendOutcome) -> Decision:
        if not isinstance(outcome, Accepted):
            metrics.PROVIDER_ERRORS.labels(self.provider.name, type(outcome).__name__.lower()).inc()
        return decide(
            outcome,
            Attempt(
                message.attempt,
                message.max_attempts,
                message.claimed_at or self.clock(),
                message.ambiguous_since,
            ),
            now=self.clock(),
            policy=self.config.policy,
            key_window=self.provider.idempotency_window,
            rng=self.rng,
        )
