"""Intake: the one door from input to a checked `NewMessage`.

    with engine.begin() as conn:                 # the application's transaction
        conn.execute(insert(users).values(...))
        mailbag.enqueue(conn, to="ada@example.com", template="welcome",
                        data={"name": "Ada"}, idempotency_key=f"welcome-{user_id}")

Every way into the outbox turns its input into a message here, by one recipe
(`Rules.message`): the API (POST /v1/messages and each item of its batch), the CLI
(`enqueue`, `send-bulk`), Django (its email backend and `mailbag.django.enqueue`), the
verification service's email, and `mailbag.enqueue`, `enqueue_async`, `enqueue_many`,
`enqueue_many_async` (this module's). The recipe:

1. `new_message` under the deployment's rules: the addresses it can send to
   (`address_rules`: ALLOW_TEST_DOMAINS, and whether the provider carries a UTF-8 local
   part), how much one message may carry (`limits`: the size settings and what the
   provider's class declares in its `Capabilities`);
2. when it is written (services.outbox), the template version it renders with, its
   tenant's in the database in the locale it asks for, else the deployment's file
   template (services.templates.pinned), and one render of it with its data
   (compose.check_renders), so that what would fail at send time is refused now.

A verification email's template also takes fields that are never stored (its token and
link: the worker derives them again when it renders). The verification service derives
them and pins its email itself with them (`secrets`): they join the data for the render
check only, so that email is checked as fully as any other.

The rules come from Settings: the API, the CLI and Django pass theirs; `mailbag.enqueue*`
use the deployment's (`deployment_rules`: the environment and mailbag.toml, read once per
process) unless given `settings=`. Arguments given explicitly (`limits=`,
`address_rules=`) win over the rules' own. Writing the checked
messages is services.outbox's; nothing here commits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from mailbag import providers
from mailbag.domain.bulk import unsubscribe_problem
from mailbag.domain.content import Limits
from mailbag.domain.erasure import ErasureKey
from mailbag.domain.message import (
    AddressInput,
    AddressRules,
    InvalidMessage,
    NewMessage,
    new_message,
)
from mailbag.domain.routing import TENANT_ACCOUNT, Routing
from mailbag.providers.base import LOCAL_PROVIDERS
from mailbag.services.outbox import write_many, write_many_async
from mailbag.store.enqueue import Enqueued

if TYPE_CHECKING:  # the asyncio extension brings in the ORM: sync callers never need it
    from sqlalchemy.ext.asyncio import AsyncConnection

    from mailbag.settings import Settings
    from mailbag.templates import Catalog
    from mailbag.templates.book import Book


def address_rules(settings: Settings, provider: str | None = None) -> AddressRules:
    """What enqueue accepts as an address with these settings and `provider` (a name of
    theirs; None: the one most mail goes to): test domains as ALLOW_TEST_DOMAINS says
    (unset: only with a provider where nothing leaves the machine), a non-ASCII local part
    only if the provider declares it can carry one."""
    kind = _kind(settings, provider)
    allow = settings.allow_test_domains
    if allow is None:
        allow = kind in LOCAL_PROVIDERS
    return AddressRules(
        allow_test_domains=allow,
        utf8_local_part=providers.capabilities(kind).utf8_local_part,
        provider=kind,
    )


def limits(settings: Settings, provider: str | None = None) -> Limits:
    """How much one message may carry with these settings: the sizes they set, and what
    the provider (as in `address_rules`) declares it cannot carry."""
    kind = _kind(settings, provider)
    sizes = Limits(
        max_recipients=settings.max_recipients,
        max_attachment_bytes=settings.max_attachment_bytes,
        max_message_bytes=settings.max_message_bytes,
        provider=kind,
    )
    declared = providers.capabilities(kind)
    return replace(
        sizes,
        max_reply_to=declared.max_reply_to,
        max_name_length=declared.max_name_length,
        attachment_extensions=declared.attachment_extensions,
    )


def _kind(settings: Settings, provider: str | None) -> str:
    """The kind of the provider named `provider`; None: PROVIDER, or with `[providers]`
    tables the first of the default route (a tenant's own account aside)."""
    if not settings.providers:
        return settings.provider
    if provider is None:
        named = [n for n in settings.routing.default.providers if n != TENANT_ACCOUNT]
        if not named:
            return settings.provider
        provider = named[0]
    return str(settings.providers[provider]["kind"])


@dataclass(frozen=True)
class Carrier:
    """One provider of a deployment with several: the rules it sends under."""

    name: str
    address_rules: AddressRules
    limits: Limits


@dataclass(frozen=True)
class Rules:
    """What a deployment accepts at enqueue, from its Settings (`Rules.of`)."""

    address_rules: AddressRules
    limits: Limits
    catalog: Catalog
    max_attempts: int
    # With several providers: each one's rules, and the routes that say which a message
    # may go to; a message is accepted if one provider of its route can carry it.
    carriers: tuple[Carrier, ...] = ()
    routing: Routing | None = None
    ready_from: str | None = None  # Settings.ready_from: sender domains must be ready
    # REQUIRE_UNSUBSCRIBE_FOR_BULK, and whether mailbag makes its own links (PUBLIC_URL).
    require_unsubscribe: bool = False
    makes_unsubscribe_links: bool = False
    # What erased addresses are hashed under, for connections mailbag did not make.
    erasure_key: ErasureKey | None = None

    @classmethod
    def of(cls, settings: Settings, *, catalog: Catalog | None = None) -> Rules:
        """The rules `settings` make, with the worker's templates (`catalog`: one already
        loaded from settings.templates_dir, as the API holds it). Cheap: the catalog is
        read once per templates folder, each provider's capabilities once."""
        carriers = tuple(
            Carrier(name, address_rules(settings, name), limits(settings, name))
            for name in settings.providers
        )
        return cls(
            address_rules=address_rules(settings),
            limits=limits(settings),
            catalog=catalog if catalog is not None else load_catalog(settings.templates_dir),
            max_attempts=settings.max_attempts,
            carriers=carriers,
            routing=settings.routing if carriers else None,
            ready_from=settings.ready_from,
            require_unsubscribe=settings.require_unsubscribe_for_bulk,
            makes_unsubscribe_links=settings.public_url is not None,
            erasure_key=settings.erasure_key,
        )

    @property
    def book(self) -> Book:
        """The templates messages render with: tenants' versions, then `catalog`'s."""
        return book_of(self.catalog)

    def message(self, **fields: Any) -> NewMessage:
        """`new_message` under these rules: InvalidMessage (MessageTooLarge) for whatever
        the deployment could not send. `address_rules` or `limits` given in `fields` win.
        Its template is looked up, and rendered once, when it is written (outbox.write_many:
        a tenant's template is in the database)."""
        if self.carriers and "address_rules" not in fields and "limits" not in fields:
            message = self._routed(fields)
        else:
            fields.setdefault("address_rules", self.address_rules)
            fields.setdefault("limits", self.limits)
            message = new_message(**fields)
        if self.require_unsubscribe and (
            problem := unsubscribe_problem(
                message.bulk,
                message.unsubscribe_url,
                message.unsubscribe_mailto,
                self.makes_unsubscribe_links,
            )
        ):
            raise InvalidMessage({"unsubscribe_url": problem})
        return message

    def _routed(self, fields: Mapping[str, Any]) -> NewMessage:
        """The message as the first provider of its route that can carry it accepts it;
        else the refusal of the first of its route."""
        assert self.routing is not None
        refused: dict[str, InvalidMessage] = {}
        route = None
        for carrier in self.carriers:
            try:
                built = new_message(
                    **fields, address_rules=carrier.address_rules, limits=carrier.limits
                )
            except InvalidMessage as exc:
                refused[carrier.name] = exc
                continue
            recipients = [address.address for address in built.recipients]
            route = self.routing.route_for(built.tenant_id, built.tags, recipients)
            if carrier.name in route.providers:
                return built
        if route is None:  # no provider could carry it: the first one's reason
            raise next(iter(refused.values()))
        first = next((refused[name] for name in route.providers if name in refused), None)
        if first is not None:
            raise first
        # The route holds only the tenant's own account, whose kind is the database's:
        # checked under the default provider's rules.
        return new_message(**fields, address_rules=self.address_rules, limits=self.limits)

    def check(self, message: NewMessage) -> NewMessage:
        """A message built elsewhere (by `mailbag.new_message`, under no deployment's
        rules), checked again under these."""
        return self.message(**message.fields())


def book_of(catalog: Catalog) -> Book:
    from mailbag.templates.book import book_of

    return book_of(catalog)


def book(settings: Settings) -> Book:
    """The Book of a deployment with these settings (one per TEMPLATES_DIR and process)."""
    return book_of(load_catalog(settings.templates_dir))


@lru_cache(maxsize=8)
def load_catalog(templates_dir: Path | None) -> Catalog:
    """The templates a worker with this TEMPLATES_DIR renders (read once per process)."""
    from mailbag import templates

    return templates.load(templates_dir)


@cache
def deployment_rules() -> Rules:
    """The rules of this process's deployment: its Settings as `mailbag worker` reads them
    (MAILBAG_* variables, mailbag.toml), read once."""
    from mailbag.settings import Settings

    return Rules.of(Settings())


def rules_for(settings: Settings | None) -> Rules:
    return deployment_rules() if settings is None else Rules.of(settings)


# --- the application's doors: mailbag.enqueue, enqueue_async, enqueue_many(_async) ----


def enqueue(
    conn: Connection,
    *,
    to: AddressInput | Sequence[AddressInput],
    settings: Settings | None = None,
    max_attempts: int | None = None,
    **fields: Any,
) -> Enqueued:
    """Validate one message and add it to the outbox in the caller's transaction. `fields`
    are `new_message`'s: a template with data, or ready-made subject/html/text; cc, bcc,
    reply_to, from_address, attachments (a list of `Attachment`), expires_at, priority,
    unsubscribe_url, idempotency_key, ... It is checked as the API checks it, under the
    deployment's Settings (`settings` to give others): the provider's limits and address
    rules, the templates the worker has, a render with `data`. Raises InvalidMessage
    (MessageTooLarge over a size limit) and writes nothing when a field is wrong.
    `max_attempts` defaults to the settings' MAX_ATTEMPTS."""
    rules = rules_for(settings)
    message = rules.message(to=to, **fields)
    return write_many(
        conn,
        [message],
        max_attempts=max_attempts or rules.max_attempts,
        erasure_key=rules.erasure_key,
        ready_from=rules.ready_from,
        book=rules.book,
    )[0]


async def enqueue_async(
    conn: AsyncConnection,
    *,
    to: AddressInput | Sequence[AddressInput],
    settings: Settings | None = None,
    max_attempts: int | None = None,
    **fields: Any,
) -> Enqueued:
    """`enqueue` on an AsyncConnection."""
    rules = rules_for(settings)
    message = rules.message(to=to, **fields)
    written = await write_many_async(
        conn,
        [message],
        max_attempts=max_attempts or rules.max_attempts,
        ready_from=rules.ready_from,
        erasure_key=rules.erasure_key,
        book=rules.book,
    )
    return written[0]


def enqueue_many(
    conn: Connection,
    messages: Sequence[NewMessage],
    *,
    settings: Settings | None = None,
    max_attempts: int | None = None,
) -> list[Enqueued]:
    """Messages made with `mailbag.new_message`, each checked as `enqueue` checks one,
    then written together. One that the deployment cannot send raises InvalidMessage
    before anything is written."""
    rules = rules_for(settings)
    checked = [rules.check(message) for message in messages]
    return write_many(
        conn,
        checked,
        max_attempts=max_attempts or rules.max_attempts,
        erasure_key=rules.erasure_key,
        ready_from=rules.ready_from,
        book=rules.book,
    )


async def enqueue_many_async(
    conn: AsyncConnection,
    messages: Sequence[NewMessage],
    *,
    settings: Settings | None = None,
    max_attempts: int | None = None,
) -> list[Enqueued]:
    """`enqueue_many` on an AsyncConnection."""
    rules = rules_for(settings)
    checked = [rules.check(message) for message in messages]
    return await write_many_async(
        conn,
        checked,
        max_attempts=max_attempts or rules.max_attempts,
        erasure_key=rules.erasure_key,
        ready_from=rules.ready_from,
        book=rules.book,
    )
