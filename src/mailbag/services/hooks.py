"""Event hooks for operators: endpoints and their secrets, deliveries, replays.

One service, `Hooks` (async), for every door: the admin API and the console hold it in the
Services container, the CLI runs it with asyncio.run (cli/invocation.on_async_engine). An
action means the same thing wherever it is taken; every replay is recorded with the
operator as the actor. A tenant is named by its id or its name (services.tenants).

With HOOKS_KEY unset hooks are off: every method raises `HooksOff` (the API answers 404
problem "hooks are off", the CLI says which setting to set), the worker delivers nothing
and the fan-out writes nothing.

Errors:
    HooksOff            HOOKS_KEY is not set
    InvalidHook         (domain.hooks) a URL, event list or description the rules refuse: 422
    UnknownEndpoint     no such endpoint (for this tenant, when one is given): 404
    UnknownDelivery     no such delivery (for this tenant, when one is given): 404
    NotReplayable       the delivery is pending, processing or retrying already: 409
    UnknownTenant       (services.tenants) no tenant has that id or name: 404, exit 2
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from mailbag.clock import utcnow
from mailbag.domain.hooks import (
    DeliveryEvent,
    DState,
    EndpointFields,
    HookDelivery,
    HookEndpoint,
    HookEvent,
    SecretBox,
    check_endpoint,
    new_secret,
)
from mailbag.domain.ids import uuid7
from mailbag.services.tenants import tenant_id_of
from mailbag.settings import Settings
from mailbag.store import hooks as store
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy.ext.asyncio import AsyncEngine

PAGE_MAX = 200
T = TypeVar("T")


def fan_out(settings: Settings) -> store.FanOut:
    """How a process with these settings fans events out to hook endpoints: off while
    HOOKS_KEY is unset. Whoever builds an engine from settings (the API, the worker, the
    CLI, mailbag.testing) gives it these options, with the erasure key: services.erasure
    .engine_options(settings)."""
    return store.FanOut(enabled=settings.hooks_enabled, max_attempts=settings.hook_max_attempts)


class HooksOff(Exception):
    """HOOKS_KEY is not set: hooks are off."""

    def __init__(self) -> None:
        super().__init__("hooks are off: set MAILBAG_HOOKS_KEY (32+ characters) to turn them on")


class UnknownEndpoint(LookupError):
    def __init__(self, endpoint_id: object) -> None:
        super().__init__(f"no hook endpoint {endpoint_id}")


class UnknownDelivery(LookupError):
    def __init__(self, delivery_id: object) -> None:
        super().__init__(f"no hook delivery {delivery_id}")


class NotReplayable(Exception):
    """Only a delivered or dead delivery can be replayed; the others are on their way."""


@dataclass(frozen=True)
class DeliveryFilter:
    """Which deliveries a listing shows; None: any. Newest first."""

    tenant_id: str | None = None
    endpoint_id: uuid.UUID | None = None
    status: DState | None = None
    event: HookEvent | None = None
    message_id: uuid.UUID | None = None


@dataclass(frozen=True)
class DeliveryPage:
    deliveries: list[HookDelivery]
    # Pass it back as `cursor` for the next (older) page; None: this was the last one.
    next_cursor: str | None


@dataclass(frozen=True)
class DeliveryDetail:
    delivery: HookDelivery
    history: list[DeliveryEvent] = field(default_factory=list)  # oldest first


@dataclass(frozen=True)
class NewSecret:
    """An endpoint with its signing secret, `whsec_...`: shown this once, stored encrypted."""

    endpoint: HookEndpoint
    secret: str


class _Plans:
    """What both services run: each operation as one plan, checked before any SQL."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def box(self) -> SecretBox:
        if self.settings.hooks_key is None:
            raise HooksOff()
        return SecretBox(self.settings.hooks_key.get_secret_value())

    def fields(
        self, url: str | None, events: list[str] | None, description: str | None
    ) -> EndpointFields:
        return check_endpoint(
            url=url, events=events, description=description, policy=self.settings.hook_url_policy
        )

    def create(
        self,
        tenant: str,
        url: str,
        events: list[str],
        description: str | None,
        enabled: bool,
    ) -> Plan[NewSecret]:
        box = self.box()
        checked = self.fields(url, events, description)
        tenant_id = yield from tenant_id_of(tenant)
        now, secret = utcnow(), new_secret()
        endpoint = HookEndpoint(
            id=uuid7(),
            tenant_id=tenant_id,
            url=url.strip(),
            events=checked.events or frozenset(),
            enabled=enabled,
            description=checked.description,
            created_at=now,
            updated_at=now,
        )
        yield from store.create_endpoint(endpoint, box.seal(secret))
        return NewSecret(endpoint, secret)

    def listing(self, tenant: str | None) -> Plan[list[HookEndpoint]]:
        self.box()
        tenant_id = (yield from tenant_id_of(tenant)) if tenant else None
        return (yield from store.endpoints(tenant_id))

    def get(self, endpoint_id: uuid.UUID, tenant_id: str | None) -> Plan[HookEndpoint]:
        self.box()
        found = yield from store.endpoint(endpoint_id, tenant_id)
        if found is None:
            raise UnknownEndpoint(endpoint_id)
        return found

    def update(
        self,
        endpoint_id: uuid.UUID,
        tenant_id: str | None,
        *,
        url: str | None,
        events: list[str] | None,
        enabled: bool | None,
        description: str | None,
    ) -> Plan[HookEndpoint]:
        self.box()
        checked = self.fields(url, events, description)
        changed = yield from store.update_endpoint(
            endpoint_id,
            tenant_id=tenant_id,
            now=utcnow(),
            url=None if url is None else url.strip(),
            events=checked.events,
            enabled=enabled,
            # Given but blank: the description is cleared.
            description=None if description is None else (checked.description or ""),
        )
        if changed is None:
            raise UnknownEndpoint(endpoint_id)
        return changed

    def rotate(self, endpoint_id: uuid.UUID, tenant_id: str | None) -> Plan[NewSecret]:
        box, secret = self.box(), new_secret()
        changed = yield from store.update_endpoint(
            endpoint_id, tenant_id=tenant_id, now=utcnow(), sealed_secret=box.seal(secret)
        )
        if changed is None:
            raise UnknownEndpoint(endpoint_id)
        return NewSecret(changed, secret)

    def delete(self, endpoint_id: uuid.UUID, tenant_id: str | None) -> Plan[None]:
        self.box()
        if not (yield from store.delete_endpoint(endpoint_id, tenant_id)):
            raise UnknownEndpoint(endpoint_id)

    def deliveries(
        self, filter: DeliveryFilter, cursor: str | None, limit: int
    ) -> Plan[DeliveryPage]:
        self.box()
        if not 1 <= limit <= PAGE_MAX:
            raise ValueError(f"limit must be 1 to {PAGE_MAX}")
        after = store.decode_cursor(cursor) if cursor else None
        tenant_id = filter.tenant_id
        if tenant_id is not None:
            tenant_id = yield from tenant_id_of(tenant_id)
        query = store.DeliveryQuery(
            tenant_id=tenant_id,
            endpoint_id=filter.endpoint_id,
            status=filter.status,
            event=filter.event,
            message_id=filter.message_id,
        )
        found, more = yield from store.page(query, limit=limit, after=after)
        return DeliveryPage(found, store.encode_cursor(found[-1]) if more and found else None)

    def delivery(self, delivery_id: uuid.UUID, tenant_id: str | None) -> Plan[DeliveryDetail]:
        self.box()
        found = yield from store.delivery(delivery_id, tenant_id)
        if found is None:
            raise UnknownDelivery(delivery_id)
        return DeliveryDetail(*found)

    def replay(
        self, delivery_id: uuid.UUID, actor: str, tenant_id: str | None
    ) -> Plan[HookDelivery]:
        self.box()
        replayed = yield from store.replay(
            delivery_id,
            tenant_id=tenant_id,
            now=utcnow(),
            actor=actor,
            extra_attempts=self.settings.hook_max_attempts,
        )
        if replayed is not None:
            return replayed
        found = yield from store.delivery(delivery_id, tenant_id)
        if found is None:
            raise UnknownDelivery(delivery_id)
        raise NotReplayable(
            f"delivery {delivery_id} is {found[0].status.value}: only delivered or dead "
            "deliveries can be replayed"
        )


class Hooks:
    """Hooks for the admin API, the console and the CLI. `tenant` (an id or a name) or
    `tenant_id` limits an operation to one tenant's endpoints and deliveries (None: any
    tenant, the operator's view)."""

    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.engine, self.settings = engine, settings
        self.db, self.plans = AsyncDatabase(engine), _Plans(settings)

    @property
    def enabled(self) -> bool:
        """Whether HOOKS_KEY is set; when False every method raises HooksOff."""
        return self.settings.hooks_enabled

    async def _write(self, plan: Plan[T]) -> T:
        async with self.db.transaction() as tx:
            return await tx.run(plan)

    async def _read(self, plan: Plan[T]) -> T:
        async with self.db.connect(read_only=True) as session:
            return await session.run(plan)

    async def create_endpoint(
        self,
        tenant: str,
        url: str,
        events: list[str],
        description: str | None = None,
        *,
        enabled: bool = True,
    ) -> NewSecret:
        """A new endpoint for a tenant, subscribed to `events` (`sent` or
        `message.sent`, `*` for all; domain.hooks.parse_events) and its secret."""
        plan = self.plans.create(tenant, url, events, description, enabled)
        return await self._write(plan)

    async def list_endpoints(self, tenant: str | None = None) -> list[HookEndpoint]:
        """Endpoints, oldest first; one tenant's, or every tenant's."""
        return await self._read(self.plans.listing(tenant))

    async def get_endpoint(
        self, endpoint_id: uuid.UUID, tenant_id: str | None = None
    ) -> HookEndpoint:
        return await self._read(self.plans.get(endpoint_id, tenant_id))

    async def update_endpoint(
        self,
        endpoint_id: uuid.UUID,
        *,
        tenant_id: str | None = None,
        url: str | None = None,
        events: list[str] | None = None,
        enabled: bool | None = None,
        description: str | None = None,
    ) -> HookEndpoint:
        """Change what is given (None: keep; description "" removes it). Disabling stops
        deliveries to it (pending ones wait, and go out when it is enabled again)."""
        plan = self.plans.update(
            endpoint_id,
            tenant_id,
            url=url,
            events=events,
            enabled=enabled,
            description=description,
        )
        return await self._write(plan)

    async def rotate_secret(
        self, endpoint_id: uuid.UUID, tenant_id: str | None = None
    ) -> NewSecret:
        """A new secret, effective at once for every later attempt (pending ones too)."""
        return await self._write(self.plans.rotate(endpoint_id, tenant_id))

    async def delete_endpoint(self, endpoint_id: uuid.UUID, tenant_id: str | None = None) -> None:
        """Remove it with its deliveries and their history."""
        await self._write(self.plans.delete(endpoint_id, tenant_id))

    async def list_deliveries(
        self, filter: DeliveryFilter, *, cursor: str | None = None, limit: int = 50
    ) -> DeliveryPage:
        """Deliveries, newest first, `limit` (1..PAGE_MAX) a page. ValueError: a bad cursor
        or limit."""
        return await self._read(self.plans.deliveries(filter, cursor, limit))

    async def get_delivery(
        self, delivery_id: uuid.UUID, tenant_id: str | None = None
    ) -> DeliveryDetail:
        """A delivery with its history (each attempt: status code, error; each replay)."""
        return await self._read(self.plans.delivery(delivery_id, tenant_id))

    async def replay(
        self, delivery_id: uuid.UUID, *, actor: str, tenant_id: str | None = None
    ) -> HookDelivery:
        """Send a delivered or dead delivery again, with the same webhook-id and body and a
        fresh attempt budget; recorded with `actor`. NotReplayable otherwise."""
        return await self._write(self.plans.replay(delivery_id, actor, tenant_id))
