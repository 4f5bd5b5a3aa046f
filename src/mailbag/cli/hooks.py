"""`mailbag hooks`: event hook endpoints, their signing secrets and their deliveries (the
same service the admin API and the console use).

A secret is printed twice at most: by `add` and by `rotate-secret`, alone on stdout (the
rest goes to stderr), so `SECRET=$(mailbag hooks add ...)` captures just the secret.

Exits, as every command: 2 for bad input (a URL, an event, an id, a tenant), 1 for what
cannot be done (hooks are off, no such endpoint or delivery, a replay of one on its way).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from mailbag.cli.help import Command, group
from mailbag.cli.invocation import ACTOR, fail, on_async_engine, settings

if TYPE_CHECKING:
    from mailbag.domain.hooks import HookDelivery, HookEndpoint
    from mailbag.services.hooks import Hooks

T = TypeVar("T")

hooks = group("Event hooks: signed HTTP POSTs of message events to your endpoints.")

TENANT = Annotated[str, typer.Argument(metavar="TENANT", help="Tenant id or name (or `default`).")]
ENDPOINT = Annotated[
    str, typer.Argument(metavar="ENDPOINT", help="The endpoint's id (see `mailbag hooks list`).")
]
DELIVERY = Annotated[
    str, typer.Argument(metavar="DELIVERY", help="The delivery's id (see `hooks deliveries`).")
]
EVENTS_HELP = (
    "An event to receive (repeatable): sent, failed, dead, unknown, delivered, bounced, "
    "complained, opened, clicked (also as message.sent and so on); * for all."
)


def _service(action: Callable[[Hooks], Awaitable[T]]) -> T:
    """Run one call of the hooks service (the API's and the console's own); its errors
    become messages and exits."""
    from mailbag.domain.hooks import InvalidHook
    from mailbag.services import hooks as hook_service
    from mailbag.services.tenants import UnknownTenant

    config = settings()
    if not config.hooks_enabled:  # before the database: nothing to look at
        fail(str(hook_service.HooksOff()), code=1)
    try:
        return on_async_engine(lambda engine: action(hook_service.Hooks(engine, config)))
    except InvalidHook as exc:
        fail(f"invalid hook endpoint: {exc}")
    except UnknownTenant as exc:
        fail(str(exc))
    except (
        hook_service.HooksOff,
        hook_service.UnknownEndpoint,
        hook_service.UnknownDelivery,
        hook_service.NotReplayable,
    ) as exc:
        fail(str(exc), code=1)


def _id(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        fail(f"{value!r} is not {what} id (a UUID)")


def _endpoint_line(e: HookEndpoint) -> str:
    events = ",".join(sorted(event.short for event in e.events))
    state = "enabled" if e.enabled else "disabled"
    return f"{e.id}\t{e.tenant_id}\t{state}\t{events}\t{e.url}\t{e.description or ''}"


def _show_secret(endpoint: HookEndpoint, secret: str, verb: str) -> None:
    typer.echo(f"{verb} endpoint {endpoint.id} for {endpoint.tenant_id}: {endpoint.url}", err=True)
    typer.echo("its signing secret, shown this once (stored encrypted):", err=True)
    typer.echo(secret)


@hooks.command("add", cls=Command)
def add(
    tenant: TENANT,
    url: Annotated[
        str, typer.Argument(metavar="URL", help="Where the signed POSTs go (https://).")
    ],
    event: Annotated[list[str], typer.Option("--event", "-e", metavar="EVENT", help=EVENTS_HELP)],
    description: Annotated[
        str | None, typer.Option(metavar="TEXT", help="A note for operators.")
    ] = None,
    disabled: Annotated[
        bool, typer.Option("--disabled", help="Create it turned off (enable it later).")
    ] = False,
) -> None:
    """Subscribe a URL to a tenant's message events; print its signing secret (once)."""
    new = _service(
        lambda svc: svc.create_endpoint(tenant, url, event, description, enabled=not disabled)
    )
    _show_secret(new.endpoint, new.secret, "added")


@hooks.command("list", cls=Command)
def list_(
    tenant: Annotated[
        str | None, typer.Option(metavar="TENANT", help="Only this tenant's (id or name).")
    ] = None,
) -> None:
    """Endpoints: id, tenant, enabled/disabled, events, URL, description (never secrets)."""
    for endpoint in _service(lambda svc: svc.list_endpoints(tenant)):
        typer.echo(_endpoint_line(endpoint))


@hooks.command("update", cls=Command)
def update(
    endpoint: ENDPOINT,
    url: Annotated[str | None, typer.Option(metavar="URL", help="A new URL.")] = None,
    event: Annotated[
        list[str] | None,
        typer.Option(
            "--event", "-e", metavar="EVENT", help="Replace the events with these (repeatable)."
        ),
    ] = None,
    description: Annotated[str | None, typer.Option(metavar="TEXT", help="A new note.")] = None,
) -> None:
    """Change an endpoint's URL, events or description."""
    if url is None and not event and description is None:
        fail("give --url, --event or --description")
    endpoint_id = _id(endpoint, "an endpoint")
    changed = _service(
        lambda svc: svc.update_endpoint(
            endpoint_id, url=url, events=event or None, description=description
        )
    )
    typer.echo(_endpoint_line(changed))


def _switch(endpoint: str, enabled: bool) -> None:
    endpoint_id = _id(endpoint, "an endpoint")
    changed = _service(lambda svc: svc.update_endpoint(endpoint_id, enabled=enabled))
    typer.echo(_endpoint_line(changed))


@hooks.command("enable", cls=Command)
def enable(endpoint: ENDPOINT) -> None:
    """Turn an endpoint on: deliveries that waited go out."""
    _switch(endpoint, True)


@hooks.command("disable", cls=Command)
def disable(endpoint: ENDPOINT) -> None:
    """Turn an endpoint off: its deliveries wait until it is enabled again."""
    _switch(endpoint, False)


@hooks.command("rotate-secret", cls=Command)
def rotate_secret(endpoint: ENDPOINT) -> None:
    """Give an endpoint a new signing secret and print it (once); the old one stops at once."""
    endpoint_id = _id(endpoint, "an endpoint")
    new = _service(lambda svc: svc.rotate_secret(endpoint_id))
    _show_secret(new.endpoint, new.secret, "rotated")


@hooks.command("remove", cls=Command)
def remove(endpoint: ENDPOINT) -> None:
    """Remove an endpoint, with its deliveries and their history."""
    endpoint_id = _id(endpoint, "an endpoint")
    _service(lambda svc: svc.delete_endpoint(endpoint_id))
    typer.echo(f"removed {endpoint_id}")


def _delivery_line(d: HookDelivery) -> str:
    from mailbag.domain.hooks import CLAIMABLE_DELIVERIES  # the states with a next attempt

    waiting = d.status in CLAIMABLE_DELIVERIES
    next_at = d.next_attempt_at.isoformat(timespec="seconds") if waiting else "-"
    code = str(d.last_status_code) if d.last_status_code is not None else "-"
    return "\t".join(
        (
            str(d.id),
            d.status,
            d.event.short,
            d.attempts_shown,
            code,
            next_at,
            str(d.message_id),
            (d.last_error or "").replace("\n", " ")[:200],
        )
    )


@hooks.command("deliveries", cls=Command)
def deliveries(
    tenant: Annotated[
        str | None, typer.Option(metavar="TENANT", help="Only this tenant's (id or name).")
    ] = None,
    endpoint: Annotated[
        str | None, typer.Option(metavar="ENDPOINT", help="Only this endpoint's.")
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(metavar="STATE", help="pending, processing, retrying, delivered or dead."),
    ] = None,
    event: Annotated[
        str | None, typer.Option(metavar="EVENT", help="Only this event (e.g. bounced).")
    ] = None,
    message: Annotated[
        str | None, typer.Option(metavar="MESSAGE_ID", help="Only this message's.")
    ] = None,
    limit: Annotated[
        int, typer.Option(metavar="N", min=1, max=200, help="At most this many.")
    ] = 50,
    cursor: Annotated[
        str | None, typer.Option(metavar="CURSOR", help="The next page (printed after one).")
    ] = None,
) -> None:
    """Deliveries, newest first: id, status, event, attempts, last HTTP status, next
    attempt, message, last error."""
    from mailbag.domain.hooks import DState, InvalidHook, parse_events
    from mailbag.services.hooks import DeliveryFilter

    chosen_status = None
    if status is not None:
        try:
            chosen_status = DState(status)
        except ValueError:
            fail(f"--status must be one of {', '.join(s.value for s in DState)}")
    chosen_event = None
    if event is not None:
        try:
            events = parse_events([event])
        except InvalidHook as exc:
            fail(str(exc))
        if len(events) != 1:
            fail("--event names one event")
        (chosen_event,) = events
    where = DeliveryFilter(
        tenant_id=tenant,
        endpoint_id=_id(endpoint, "an endpoint") if endpoint else None,
        status=chosen_status,
        event=chosen_event,
        message_id=_id(message, "a message") if message else None,
    )
    try:
        page = _service(lambda svc: svc.list_deliveries(where, cursor=cursor, limit=limit))
    except ValueError as exc:  # a cursor the service never gave out
        fail(f"--cursor: {exc}")
    for delivery in page.deliveries:
        typer.echo(_delivery_line(delivery))
    if page.next_cursor:
        typer.echo(f"more: --cursor {page.next_cursor}", err=True)


@hooks.command("delivery", cls=Command)
def delivery(delivery_id: DELIVERY) -> None:
    """One delivery: its fields, the body it POSTs, and its history (attempts, replays)."""
    target = _id(delivery_id, "a delivery")
    found = _service(lambda svc: svc.get_delivery(target))
    d = found.delivery
    typer.echo(_delivery_line(d))
    typer.echo(f"endpoint {d.endpoint_id} {d.url or ''}  webhook-id {d.webhook_id}")
    typer.echo(f"body: {d.payload}")
    for e in found.history:
        code = f" HTTP {e.status_code}" if e.status_code is not None else ""
        came = e.from_status or "-"
        typer.echo(
            f"{e.at.isoformat(timespec='seconds')}\t{came} -> {e.to_status}\t"
            f"attempt {e.attempt}{code}\t{e.actor}\t{e.detail or ''}"
        )


@hooks.command("replay", cls=Command)
def replay(delivery_id: DELIVERY) -> None:
    """Send a delivered or dead delivery again (same body and webhook-id)."""
    target = _id(delivery_id, "a delivery")
    again = _service(lambda svc: svc.replay(target, actor=ACTOR))
    typer.echo(f"replayed {again.id}: {again.status}, the worker sends it again")
