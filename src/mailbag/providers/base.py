"""The one interface every provider implements, and the registry that finds them.

A provider turns an `OutgoingEmail` into a `SendOutcome` (domain.delivery). It never
raises for a delivery problem: it classifies it, in one table per provider, as Accepted,
Rejected (permanent), Deferred (known not accepted), Ambiguous (may have been accepted) or
Disabled. Adding a provider: write a class with these members, whose constructor takes
what it needs as keyword arguments, and register its `from_settings` (or any function from
Settings to the provider, annotated with the class it returns),

    from mailbag.providers import register
    from mailbag.providers.base import Capabilities, SendOneByOne

    class PostmarkProvider(SendOneByOne):
        capabilities = Capabilities(max_reply_to=1)  # what enqueue must refuse for it

        def __init__(self, *, server_token: str, timeout: float) -> None: ...

        @classmethod
        def from_settings(cls, settings: Settings) -> PostmarkProvider: ...

    register("postmark")(PostmarkProvider.from_settings)

or expose the factory as an entry point in the `mailbag.providers` group of your package.
Then set MAILBAG_PROVIDER=postmark. What providers share (error texts, Retry-After, outcome
tables, refusing an unsupported feature) is in providers.kit.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, get_type_hints, runtime_checkable

from mailbag.compose import OutgoingEmail
from mailbag.domain.delivery import SendOutcome

# With these providers nothing leaves the machine: test domains are fine by default.
LOCAL_PROVIDERS = frozenset({"console", "file", "capture"})


@dataclass(frozen=True)
class Capabilities:
    """What a provider can carry, declared by its class (`capabilities = Capabilities(...)`)
    and read without building it, so that enqueue refuses what the configured provider
    would refuse at send time (services.intake turns it into the address rules and limits).

    The defaults are what a provider that declares nothing gets: no UTF-8 local parts (only
    SMTPUTF8 carries them), and no limits of its own on Reply-To, names or file types."""

    # An address whose local part is not ASCII (`zoë@example.com`, RFC 6531 SMTPUTF8).
    utf8_local_part: bool = False
    max_reply_to: int | None = None  # Reply-To addresses; None: as many as the message has
    max_name_length: int | None = None  # of a recipient's or Reply-To's display name
    attachment_extensions: frozenset[str] | None = None  # lower case, no dot; None: any
    # Settings (without MAILBAG_<KIND>_) it cannot send without: a `[providers.NAME]` table
    # missing one stops the worker at start (with only PROVIDER set, sends are Disabled).
    required_settings: tuple[str, ...] = ()
    # The SPF mechanism a sender domain's record needs for the mail it sends (`mailbag
    # domains`), None when mailbag cannot know it (an SMTP relay's is its operator's).
    spf: str | None = None
    # Whether it sends mailbag's MIME as it is (`OutgoingEmail.raw`), so that a sender
    # domain's DKIM signature goes out with it; the others build their own MIME and sign
    # with the domain set up at the provider.
    sends_raw_mime: bool = False


@runtime_checkable
class Provider(Protocol):
    name: str
    # How many emails one `send_batch` call may carry (1: the provider has no batch call).
    max_batch_size: int
    # How long the provider deduplicates by `OutgoingEmail.idempotency_key`; None if it
    # does not, in which case an ambiguous send can never be retried safely.
    idempotency_window: timedelta | None
    # What it can carry (a class attribute: enqueue reads it from the class behind the
    # registered factory, see `providers.capabilities`).
    capabilities: Capabilities

    async def send(self, email: OutgoingEmail) -> SendOutcome: ...

    async def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[SendOutcome]:
        """One outcome per email, in order. Providers without a batch call loop over send."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class Sighting:
    """One record a provider's lookup returned: the provider's id for a send, and whose it
    is as far as the record itself says (our message id, the recipient), so reconciliation
    can refuse a record that is not the message's own."""

    provider_message_id: str
    message_id: uuid.UUID | None
    recipient: str | None


def built_by(factory: object) -> object:
    """The class a factory builds, found without calling it: the class its `from_settings`
    is bound to, else its return annotation, else the factory itself."""
    bound_to = getattr(factory, "__self__", None)
    if isinstance(bound_to, type):
        return bound_to
    try:
        return get_type_hints(factory).get("return", factory)
    except Exception:  # an annotation that does not resolve: ask the factory itself
        return factory


class SendOneByOne:
    """Mixin for providers without a batch API: a batch is the sends one after another."""

    async def send(self, email: OutgoingEmail) -> SendOutcome:  # pragma: no cover - abstract
        raise NotImplementedError

    async def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[SendOutcome]:
        return [await self.send(email) for email in emails]

    async def aclose(self) -> None:
        return None
