"""Event hooks in the console: every tenant's endpoints and recent deliveries (filtered,
paged), one delivery with the body it POSTs and its history, and the operator's replay
(two POSTs, as every console action: the first asks, the second does it).

Secrets never appear here: the service does not hand them out after creation.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from starlette.responses import Response

from mailbag.console.actions import confirm
from mailbag.console.context import ACTOR, Console, ConsoleError
from mailbag.console.forms import parse_id
from mailbag.console.views import NO_SUCH_TENANT
from mailbag.domain.hooks import CLAIMABLE_DELIVERIES, REPLAYABLE, DState, HookDelivery, HookEvent
from mailbag.domain.message import TENANT_ID_MAX
from mailbag.services.hooks import (
    DeliveryFilter,
    Hooks,
    NotReplayable,
    UnknownDelivery,
)
from mailbag.services.tenants import UnknownTenant

PAGE_SIZE = 50
# The states with a next attempt: those a worker claims from.
WAITING = CLAIMABLE_DELIVERIES
FILTERS = ("status", "tenant", "event")


def _hooks(c: Console) -> Hooks | None:
    """The service; None when hooks are off (HOOKS_KEY unset): the page says so."""
    hooks = c.services.hooks
    return hooks if hooks.enabled else None


def delivery_url(delivery_id: object) -> str:
    return f"/admin/hooks/deliveries/{delivery_id}"


def _filter(values: dict[str, str], errors: dict[str, str]) -> DeliveryFilter:
    status = event = None
    if values["status"]:
        try:
            status = DState(values["status"])
        except ValueError:
            errors["status"] = "not a delivery state"
    if values["event"]:
        try:
            event = HookEvent(values["event"])
        except ValueError:
            errors["event"] = "not an event"
    if len(values["tenant"]) > TENANT_ID_MAX:
        errors["tenant"] = "too long for a tenant id"
    return DeliveryFilter(tenant_id=values["tenant"] or None, status=status, event=event)


async def page(c: Console) -> Response:
    """Endpoints, then deliveries newest first: state, attempts, last error, next attempt."""
    hooks = _hooks(c)
    if hooks is None:
        return c.page("hooks.html", enabled=False)
    params = c.request.query_params
    values = {name: params.get(name, "").strip() for name in FILTERS}
    errors: dict[str, str] = {}
    where = _filter(values, errors)
    if values["tenant"] and not errors.get("tenant"):  # typed as an id or a name
        try:
            where = replace(where, tenant_id=await c.tenant_id(values["tenant"]))
        except UnknownTenant:
            errors["tenant"] = NO_SUCH_TENANT
    cursor = params.get("cursor", "").strip() or None
    deliveries: list[HookDelivery] = []
    older = None
    if not errors:
        try:
            found = await hooks.list_deliveries(where, cursor=cursor, limit=PAGE_SIZE)
        except ValueError:
            errors["cursor"] = "not a page of this list; start again from the newest"
        else:
            deliveries, older = found.deliveries, found.next_cursor
    kept = {name: value for name, value in values.items() if value}
    return c.page(
        "hooks.html",
        status=400 if errors else 200,
        enabled=True,
        endpoints=await hooks.list_endpoints(),
        deliveries=deliveries,
        waiting=WAITING,
        values=values,
        errors=errors,
        states=[s.value for s in DState],
        events=[e.value for e in HookEvent],
        kept=kept,
        older={**kept, "cursor": older} if older else None,
        paged=cursor is not None,
    )


async def _load(c: Console) -> tuple[Hooks, Any]:
    hooks = _hooks(c)
    if hooks is None:
        raise ConsoleError(404, "Event hooks are off", "Set MAILBAG_HOOKS_KEY to turn them on.")
    missing = ConsoleError(404, "Not found", "There is no hook delivery with this id.")
    delivery_id = parse_id(c.request.path_params["delivery_id"])
    if delivery_id is None:
        raise missing
    try:
        return hooks, await hooks.get_delivery(delivery_id)
    except UnknownDelivery:
        raise missing from None


def _pretty(payload: str) -> str:
    try:
        return json.dumps(json.loads(payload), indent=2, sort_keys=True, ensure_ascii=False)
    except ValueError:  # stored as sent; show it as it is
        return payload


async def delivery(c: Console) -> Response:
    """One delivery: its fields, the exact body, every move (attempts, leases, replays)."""
    _, found = await _load(c)
    d: HookDelivery = found.delivery
    return c.page(
        "hooks_delivery.html",
        delivery=d,
        history=found.history,
        body=_pretty(d.payload),
        waiting=d.status in WAITING,
        replayable=d.status in REPLAYABLE,
    )


async def replay(c: Console) -> Response:
    hooks, found = await _load(c)
    d: HookDelivery = found.delivery
    back = delivery_url(d.id)
    if d.status not in REPLAYABLE:
        raise ConsoleError(
            409, "Not possible now", f"Nothing was changed: this delivery is {d.status}."
        )
    if not c.confirmed:
        return confirm(
            c,
            title="Replay this delivery?",
            question="It becomes pending and a worker POSTs the same body again, with the "
            "same webhook-id (a receiver that deduplicates by it ignores the copy) and a "
            "fresh attempt budget.",
            action=f"{back}/replay",
            fields={},
            details=[
                ("Delivery", str(d.id)),
                ("State", d.status),
                ("Tenant", c.tenant_label(d.tenant_id)),
                ("Event", d.event.value),
                ("Endpoint", d.url or str(d.endpoint_id)),
                ("webhook-id", d.webhook_id),
                ("Attempts", d.attempts_shown),
            ],
            back=back,
        )
    try:
        await hooks.replay(d.id, actor=ACTOR)
    except (NotReplayable, UnknownDelivery) as exc:  # it changed between the two POSTs
        raise ConsoleError(409, "Not possible now", f"Nothing was changed: {exc}.") from None
    return c.redirect(back, flash="Replayed: the delivery is pending again.")
