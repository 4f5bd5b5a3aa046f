"""The one interface every provider implements, and the registry that finds them.

A provider turns an `OutgoingEmail` into a `SendOutcome` (domain.delivery). It never
raises for a delivery problem: it classifies it, in one table per provider, as Accepted,
Rejected (permanent), Deferred (known not accepted), Ambiguous (may have been accepted) or
Disabled. Adding a provider: write a class with these members, whose constructor takes
what it needs as keyword arguments, and register its `from_settings` (or any function from
Settings to the provider, annotated with the class it returns),

    from mailbag.providers import register

    class PostmarkProvider(SendOneByOne):
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
from typing import TYPE_CHECKING, Protocol, get_type_hints, runtime_checkable

from mailbag.compose import OutgoingEmail
from mailbag.domain.content import Limits
from mailbag.domain.delivery import SendOutcome
from mailbag.domain.message import AddressRules

if TYPE_CHECKING:
    from mailbag.settings import Settings

# With these providers nothing leaves the machine: test domains are fine by default.
LOCAL_PROVIDERS = frozenset({"console", "file", "capture"})


@runtime_checkable
class Provider(Protocol):
    name: str
    # How many emails one `send_batch` call may carry (1: the provider has no batch call).
    max_batch_size: int
    # How long the provider deduplicates by `OutgoingEmail.idempotency_key`; None if it
    # does not, in which case an ambiguous send can never be retried safely.
    idempotency_window: timedelta | None
    # Optional (a provider without it is taken not to): whether it can send to an address
    # whose local part is not ASCII (`zoë@example.com`, SMTPUTF8). Enqueue refuses such
    # addresses when the configured provider cannot; see `address_rules`.
    # supports_utf8_local_part: bool

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


def supports_utf8_local_part(provider: object) -> bool:
    """A provider (class or instance) declares `supports_utf8_local_part`; unknown: no."""
    return bool(getattr(provider, "supports_utf8_local_part", False))


def address_rules(settings: Settings) -> AddressRules:
    """What enqueue accepts as an address with these settings: test domains as
    ALLOW_TEST_DOMAINS says (unset: only with a local provider), a non-ASCII local part
    only if the configured provider declares it can carry one. The provider is not
    created: its class is read from its factory (see `_built_by`)."""
    allow = settings.allow_test_domains
    if allow is None:
        allow = settings.provider in LOCAL_PROVIDERS
    return AddressRules(
        allow_test_domains=allow,
        utf8_local_part=supports_utf8_local_part(_provider_class(settings)),
        provider=settings.provider,
    )


def message_limits(settings: Settings) -> Limits:
    """How much one message may carry with these settings: the sizes they set, and what
    the configured provider's class declares it cannot carry (optional attributes
    `max_reply_to`, `max_name_length` and `attachment_extensions`)."""
    declared = _provider_class(settings)
    return Limits(
        max_recipients=settings.max_recipients,
        max_attachment_bytes=settings.max_attachment_bytes,
        max_message_bytes=settings.max_message_bytes,
        max_reply_to=getattr(declared, "max_reply_to", None),
        max_name_length=getattr(declared, "max_name_length", None),
        attachment_extensions=getattr(declared, "attachment_extensions", None),
        provider=settings.provider,
    )


def _provider_class(settings: Settings) -> object:
    """The configured provider's class, read from its factory; None if there is none."""
    from mailbag import providers  # the registry imports this module

    try:
        factory = providers.factory_for(settings.provider)
    except providers.UnknownProvider:
        return None
    return _built_by(factory)


def _built_by(factory: object) -> object:
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
