"""Event hooks for operators: endpoints and their secrets, deliveries, replays.

The admin API and the console use `Hooks` (async engine); the CLI uses `SyncHooks` (sync
engine). Both run the same plans (store/hooks.py), so an action means the same thing
wherever it is taken; every replay is recorded with the operator as the actor.

With HOOKS_KEY unset hooks are off: every method raises `HooksOff` (the API answers 404
problem "hooks are off", the CLI says which setting to set), the worker delivers nothing
and the fan-out writes nothing.

Errors:
    HooksOff            HOOKS_KEY is not set
    InvalidHook         (domain.hooks) a URL, event list or description the rules refuse: 422
    UnknownEndpoint     no such endpoint (for this tenant, when one is given): 404
    UnknownDelivery     no such delivery (for this tenant, when one is given): 404
    NotReplayable       the delivery is pending, processing or retrying already: 409
    UnknownTenant       (services.tenants) the CLI named no tenant: exit 1
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mailbag.domain.hooks import DeliveryEvent, DState, HookDelivery, HookEndpoint, HookEvent
from mailbag.settings import Settings

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

PAGE_MAX = 200


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


class Hooks:
    """Hooks for the admin API and the console (async). `tenant_id` limits an operation to
    one tenant's endpoints/deliveries (None: any tenant, the operator's view)."""

    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.engine, self.settings = engine, settings

    @property
    def enabled(self) -> bool:
        """Whether HOOKS_KEY is set; when False every method raises HooksOff."""
        return self.settings.hooks_enabled

    async def create_endpoint(
        self,
        tenant_id: str,
        url: str,
        events: list[str],
        description: str | None = None,
        *,
        enabled: bool = True,
    ) -> NewSecret:
        """A new endpoint for a tenant (by id), subscribed to `events` (`sent` or
        `message.sent`, `*` for all; domain.hooks.parse_events) and its secret."""
        raise NotImplementedError

    async def list_endpoints(self, tenant_id: str | None = None) -> list[HookEndpoint]:
        """Endpoints, oldest first; one tenant's, or every tenant's."""
        raise NotImplementedError

    async def get_endpoint(
        self, endpoint_id: uuid.UUID, tenant_id: str | None = None
    ) -> HookEndpoint:
        raise NotImplementedError

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
        """Change what is given (None: keep). Disabling stops deliveries to it (pending
        ones wait, and go out when it is enabled again)."""
        raise NotImplementedError

    async def rotate_secret(
        self, endpoint_id: uuid.UUID, tenant_id: str | None = None
    ) -> NewSecret:
        """A new secret, effective at once for every later attempt (pending ones too)."""
        raise NotImplementedError

    async def delete_endpoint(self, endpoint_id: uuid.UUID, tenant_id: str | None = None) -> None:
        """Remove it with its deliveries and their history."""
        raise NotImplementedError

    async def list_deliveries(
        self, filter: DeliveryFilter, *, cursor: str | None = None, limit: int = 50
    ) -> DeliveryPage:
        """Deliveries, newest first, `limit` (1..PAGE_MAX) a page. ValueError: a bad cursor."""
        raise NotImplementedError

    async def get_delivery(
        self, delivery_id: uuid.UUID, tenant_id: str | None = None
    ) -> DeliveryDetail:
        """A delivery with its history (each attempt: status code, error; each replay)."""
        raise NotImplementedError

    async def replay(
        self, delivery_id: uuid.UUID, *, actor: str, tenant_id: str | None = None
    ) -> HookDelivery:
        """Send a delivered or dead delivery again, with the same webhook-id and body and a
        fresh attempt budget; recorded with `actor`. NotReplayable otherwise."""
        raise NotImplementedError


class SyncHooks:
    """The same for the CLI (sync engine); `tenant` may be a tenant's id or its name."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine, self.settings = engine, settings

    @property
    def enabled(self) -> bool:
        return self.settings.hooks_enabled

    def create_endpoint(
        self,
        tenant: str,
        url: str,
        events: list[str],
        description: str | None = None,
        *,
        enabled: bool = True,
    ) -> NewSecret:
        raise NotImplementedError

    def list_endpoints(self, tenant: str | None = None) -> list[HookEndpoint]:
        raise NotImplementedError

    def get_endpoint(self, endpoint_id: uuid.UUID) -> HookEndpoint:
        raise NotImplementedError

    def update_endpoint(
        self,
        endpoint_id: uuid.UUID,
        *,
        url: str | None = None,
        events: list[str] | None = None,
        enabled: bool | None = None,
        description: str | None = None,
    ) -> HookEndpoint:
        raise NotImplementedError

    def rotate_secret(self, endpoint_id: uuid.UUID) -> NewSecret:
        raise NotImplementedError

    def delete_endpoint(self, endpoint_id: uuid.UUID) -> None:
        raise NotImplementedError

    def list_deliveries(
        self, filter: DeliveryFilter, *, cursor: str | None = None, limit: int = 50
    ) -> DeliveryPage:
        raise NotImplementedError

    def get_delivery(self, delivery_id: uuid.UUID) -> DeliveryDetail:
        raise NotImplementedError

    def replay(self, delivery_id: uuid.UUID, *, actor: str) -> HookDelivery:
        raise NotImplementedError
