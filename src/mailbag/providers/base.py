"""The one interface every provider implements, and the registry that finds them.

A provider turns an `OutgoingEmail` into a `SendOutcome` (domain.delivery). It never
raises for a delivery problem: it classifies it, in one table per provider, as Accepted,
Rejected (permanent), Deferred (known not accepted), Ambiguous (may have been accepted) or
Disabled. Adding a provider: write a class with these members and register a factory,

    from mailbag.providers import register

    @register("postmark")
    def create(settings: Settings) -> Provider: ...

or expose the factory as an entry point in the `mailbag.providers` group of your package.
Then set MAILBAG_PROVIDER=postmark.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol, runtime_checkable

from mailbag.compose import OutgoingEmail
from mailbag.domain.delivery import SendOutcome


@runtime_checkable
class Provider(Protocol):
    name: str
    # How many emails one `send_batch` call may carry (1: the provider has no batch call).
    max_batch_size: int
    # How long the provider deduplicates by `OutgoingEmail.idempotency_key`; None if it
    # does not, in which case an ambiguous send can never be retried safely.
    idempotency_window: timedelta | None

    async def send(self, email: OutgoingEmail) -> SendOutcome: ...

    async def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[SendOutcome]:
        """One outcome per email, in order. Providers without a batch call loop over send."""
        ...

    async def aclose(self) -> None: ...


class SendOneByOne:
    """Mixin for providers without a batch API: a batch is the sends one after another."""

    async def send(self, email: OutgoingEmail) -> SendOutcome:  # pragma: no cover - abstract
        raise NotImplementedError

    async def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[SendOutcome]:
        return [await self.send(email) for email in emails]

    async def aclose(self) -> None:
        return None
