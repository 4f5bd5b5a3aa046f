"""The pages an operator reads: overview, message list, message detail, suppressions."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any
from urllib.parse import quote

from starlette.responses import Response

from mailbag.console import attachments
from mailbag.console.chart import sent_chart
from mailbag.console.context import Console, ConsoleError
from mailbag.console.forms import FilterForm, parse_filter, parse_id
from mailbag.console.preview import inline_images, preview, redacted_data
from mailbag.domain.content import Address, Priority
from mailbag.domain.message import Message
from mailbag.domain.states import Action, Status, sources
from mailbag.services.pauses import Pauses, holding, what
from mailbag.services.tenants import UnknownTenant
from mailbag.store.fleet_state import Scope

PAGE_SIZE = 50
SUPPRESSIONS_PAGE_SIZE = 100
REQUEUEABLE = sources(Action.REQUEUE)  # unknown, dead
NO_SUCH_TENANT = "no tenant has this id or name"
CANCELLABLE = sources(Action.CANCEL)  # pending
RESOLVABLE = sources(Action.RESOLVE_SENT)  # unknown


def actions_for(status: str) -> dict[str, bool]:
    """Which action forms the detail page offers: only those the state machine allows."""
    return {
        "requeue": status in REQUEUEABLE,
        "cancel": status in CANCELLABLE,
        "resolve": status in RESOLVABLE,
    }


async def overview(c: Console) -> Response:
    health = await c.services.operations.health(c.now())
    return c.page(
        "overview.html",
        health=health,
        chart=sent_chart(health.sent_per_5_minutes),
        states=[s.value for s in Status],
    )


async def with_tenant(c: Console, form: FilterForm) -> FilterForm:
    """The filter with its tenant (typed as an id or a name) as the tenant's id, or an error
    for the field if no tenant has it: an unknown tenant lists nothing, silently, otherwise."""
    typed = form.values["tenant"]
    if not typed:
        return form
    try:
        owner = await c.tenant_id(typed)
    except UnknownTenant:
        return replace(form, errors={**form.errors, "tenant": NO_SUCH_TENANT})
    return replace(form, filter=replace(form.filter, tenant_id=owner))


async def messages(c: Console) -> Response:
    form = await with_tenant(c, parse_filter(c.request.query_params))
    before_raw = c.request.query_params.get("before", "")
    before = parse_id(before_raw) if before_raw else None
    errors = dict(form.errors)
    if before_raw and before is None:
        errors["before"] = "not a message id"
    found: list[Message] = []
    more = False
    if not errors:
        found, more = await c.services.operations.messages(
            form.filter, limit=PAGE_SIZE, before=before
        )
    return c.page(
        "messages.html",
        status=400 if errors else 200,
        form=form,
        errors=errors,
        messages=found,
        older=form.query(before=str(found[-1].id)) if more and found else None,
        paged=before is not None,
        states=[s.value for s in Status],
        bulk_requeue=form.filter.status in REQUEUEABLE,
    )


async def load_message(c: Console) -> tuple[Message, list[Any], list[Any]]:
    message_id = parse_id(c.request.path_params["message_id"])
    found = await c.services.operations.message(message_id) if message_id else None
    if found is None:
        raise ConsoleError(404, "Not found", "There is no message with this id.")
    return found


def recipients(message: Message) -> list[tuple[str, Address]]:
    """Everyone the message names, with the header (or envelope, for Bcc) they are in."""
    every = message.all_recipients
    kinds = (("To", every.to), ("Cc", every.cc), ("Bcc", every.bcc), ("Reply-To", message.reply_to))
    return [(kind, address) for kind, addresses in kinds for address in addresses]


def priority_label(value: int) -> str:
    try:
        return Priority(value).label
    except ValueError:  # not one the domain writes; show what is stored
        return str(value)


def pause_label(c: Console, scope: Scope, target: str) -> str:
    """A pause's target as the console shows it: a tenant by its name and id."""
    return what(scope, c.tenant_label(target) if scope is Scope.TENANT else target)


async def message(c: Console) -> Response:
    found, transitions, provider_events = await load_message(c)
    images = await attachments.contents(c, inline_images(found))
    # The pauses that hold it back, if it waits to be sent: said plainly at the top.
    held = holding(await Pauses(c.services.engine).listing(), found)
    book = await c.services.templates.hold([found.template_version_id])
    return c.page(
        "message.html",
        message=found,
        recipients=recipients(found),
        priority=priority_label(found.priority),
        data=redacted_data(found),
        preview=preview(found, book, c.services.settings, c.now(), images),
        transitions=transitions,
        provider_events=provider_events,
        actions=actions_for(found.status),
        held=[(p, pause_label(c, p.scope, p.target)) for p in held],
        template_url=message_template_url(found),
    )


async def suppressions(c: Console) -> Response:
    params = c.request.query_params
    tenant = params.get("tenant", "").strip()
    try:
        offset = max(0, int(params.get("offset", "0")))
    except ValueError:
        offset = 0
    errors: dict[str, str] = {}
    rows = []
    try:
        owner = await c.tenant_id(tenant) if tenant else None
    except UnknownTenant:
        errors["tenant"] = NO_SUCH_TENANT
    else:  # one more than a page tells whether a next page exists
        rows = await c.services.operations.suppressions(
            tenant_id=owner, limit=SUPPRESSIONS_PAGE_SIZE + 1, offset=offset
        )
    return c.page(
        "suppressions.html",
        status=400 if errors else 200,
        errors=errors,
        tenant=tenant,
        suppressions=rows[:SUPPRESSIONS_PAGE_SIZE],
        offset=offset,
        next_offset=offset + SUPPRESSIONS_PAGE_SIZE if len(rows) > SUPPRESSIONS_PAGE_SIZE else None,
        page_size=SUPPRESSIONS_PAGE_SIZE,
    )


def message_url(message_id: uuid.UUID | str) -> str:
    return f"/admin/messages/{message_id}"


def template_url(tenant_id: str, name: str, locale: str) -> str:
    """The console's page of a tenant's template in one locale (templates_editor.py)."""
    parts = (tenant_id, name, locale)
    return "/admin/tenants/{}/templates/{}/{}".format(*(quote(p, safe="") for p in parts))


def message_template_url(message: Message) -> str | None:
    """The page of the template version a message renders with; None: it has none (a
    file template, or ready-made content)."""
    if message.template_name is None or message.template_locale is None:
        return None
    return template_url(message.tenant_id, message.template_name, message.template_locale)
