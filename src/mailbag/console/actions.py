"""What an operator changes. Each action takes two POSTs: the first shows what will happen
and asks; the second (confirm=yes) does it, writes its audit event and redirects."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from email_validator import EmailNotValidError
from starlette.responses import Response

from mailbag.console.context import ACTOR, Console, ConsoleError
from mailbag.console.forms import parse_filter
from mailbag.console.render import utc
from mailbag.console.views import (
    REQUEUEABLE,
    actions_for,
    load_message,
    message_url,
    with_tenant,
)
from mailbag.domain.message import ERROR_MAX, TENANT_ID_MAX, Message, normalize_address
from mailbag.services.operations import BULK_LIMIT, NotAllowed

log = structlog.get_logger("mailbag.console")
PROVIDER_MESSAGE_ID_MAX = 255  # the column's width


def confirm(
    c: Console,
    *,
    title: str,
    question: str,
    action: str,
    fields: dict[str, str],
    details: list[tuple[str, str]],
    back: str,
    can_confirm: bool = True,
) -> Response:
    """The "are you sure" page: the details, and the same form again with confirm=yes."""
    return c.page(
        "confirm.html",
        title=title,
        question=question,
        action=action,
        fields=fields,
        details=details,
        back=back,
        can_confirm=can_confirm,
    )


def _message_details(c: Console, message: Message) -> list[tuple[str, str]]:
    return [
        ("Message", str(message.id)),
        ("State", message.status),
        ("Tenant", c.tenant_label(message.tenant_id)),
        ("To", message.to_address),
        ("Template", message.template_name or "none (ready-made content)"),
        ("Attempts", f"{message.attempt_count} of {message.max_attempts}"),
        ("Last change", utc(message.updated_at)),
    ]


async def _message_for(c: Console, action: str) -> Message:
    """The message in the URL, if `action` applies to it in its current state."""
    message, _, _ = await load_message(c)
    if not actions_for(message.status)[action]:
        raise NotAllowed(
            f"{action.capitalize()} does not apply to a message that is {message.status}"
        )
    return message


def _confirm_on(
    c: Console,
    message: Message,
    action: str,
    *,
    title: str,
    question: str,
    fields: dict[str, str] | None = None,
    details: list[tuple[str, str]] | None = None,
) -> Response:
    """The "are you sure" page of an action on one message."""
    return confirm(
        c,
        title=title,
        question=question,
        action=f"{message_url(message.id)}/{action}",
        fields=fields or {},
        details=[*_message_details(c, message), *(details or [])],
        back=message_url(message.id),
    )


async def _once_confirmed(
    c: Console,
    action: str,
    *,
    title: str,
    question: str,
    change: Callable[[Message], Awaitable[str]],
) -> Response:
    """Ask to confirm `action` on the form's message, then `change` it and show the
    message again with what `change` says was done."""
    message = await _message_for(c, action)
    if not c.confirmed:
        return _confirm_on(c, message, action, title=title, question=question)
    flash = await change(message)
    return c.redirect(message_url(message.id), flash=flash)


async def requeue(c: Console) -> Response:
    async def change(message: Message) -> str:
        changed = await c.services.operations.requeue(
            message_ids=[message.id], now=c.now(), actor=ACTOR
        )
        if not changed:  # it changed state between the two POSTs
            raise NotAllowed("the message is no longer unknown or dead")
        return "Requeued: the message is pending again."

    return await _once_confirmed(
        c,
        "requeue",
        title="Requeue this message?",
        question="It becomes pending and a worker sends it again, with a fresh attempt "
        "budget. If an earlier attempt did reach the recipient, they get it twice.",
        change=change,
    )


async def cancel(c: Console) -> Response:
    async def change(message: Message) -> str:
        await c.services.operations.cancel(message_id=message.id, now=c.now(), actor=ACTOR)
        return "Cancelled: the message will not be sent."

    return await _once_confirmed(
        c,
        "cancel",
        title="Cancel this message?",
        question="It will never be sent. This cannot be undone.",
        change=change,
    )


async def resolve(c: Console) -> Response:
    message = await _message_for(c, "resolve")
    outcome = c.form.get("outcome", "")
    if outcome not in ("sent", "failed"):
        raise ConsoleError(400, "Outcome missing", "Choose whether the message was sent or not.")
    evidence = c.form.get("evidence", "").strip()
    if not evidence:
        raise ConsoleError(
            400,
            "Evidence required",
            "Say what shows the outcome (a provider log line, a bounce, the recipient's "
            "word), then try again. Nothing was changed.",
        )
    if len(evidence) > ERROR_MAX:
        raise ConsoleError(400, "Evidence too long", f"At most {ERROR_MAX} characters.")
    provider_id = c.form.get("provider_message_id", "").strip() if outcome == "sent" else ""
    if len(provider_id) > PROVIDER_MESSAGE_ID_MAX:
        raise ConsoleError(400, "Provider message id too long", "That is not a provider id.")
    sent = outcome == "sent"
    if not c.confirmed:
        extra = [("Provider message id", provider_id)] if provider_id else []
        return _confirm_on(
            c,
            message,
            "resolve",
            title=f"Mark this message as {outcome}?",
            question="It was accepted by the provider: mark it sent."
            if sent
            else "It never reached the provider: mark it failed. It will not be sent again.",
            fields={"outcome": outcome, "evidence": evidence, "provider_message_id": provider_id},
            details=[("Evidence", evidence), *extra],
        )
    await c.services.operations.resolve(
        message_id=message.id,
        sent=sent,
        evidence=evidence,
        now=c.now(),
        actor=ACTOR,
        provider_message_id=provider_id or None,
    )
    return c.redirect(message_url(message.id), flash=f"Resolved: the message is now {outcome}.")


_FILTER_LABELS = (
    ("state", "State"),
    ("tenant", "Tenant"),
    ("to", "Recipient"),
    ("template", "Template"),
    ("created_from", "Created from"),
    ("created_to", "Created to"),
)


async def bulk_requeue(c: Console) -> Response:
    form = await with_tenant(c, parse_filter(c.form))
    if form.errors:
        problems = "; ".join(f"{name}: {why}" for name, why in form.errors.items())
        raise ConsoleError(400, "Invalid filter", problems)
    if form.filter.status not in REQUEUEABLE:
        raise ConsoleError(400, "Choose a state", "Bulk requeue takes unknown or dead messages.")
    back = f"/admin/messages?{form.query()}"
    if not c.confirmed:
        # Counted by listing (the service has no count); the requeue is capped at the same limit.
        matching, more = await c.services.operations.messages(
            form.filter, limit=BULK_LIMIT, before=None
        )
        count = f"more than {BULK_LIMIT}" if more else str(len(matching))
        question = f"{_messages(len(matching))} match. They become pending and are sent again."
        if more:
            question = (
                f"More than {BULK_LIMIT} messages match; the first {BULK_LIMIT} are requeued."
            )
        owner = form.filter.tenant_id
        values = {**form.values, "tenant": c.tenant_label(owner) if owner else ""}
        shown = [(label, values[name]) for name, label in _FILTER_LABELS if values[name]]
        return confirm(
            c,
            title="Requeue every matching message?",
            question=question if matching else "No messages match this filter.",
            action="/admin/messages/bulk-requeue",
            fields={k: v for k, v in form.values.items() if v},
            details=[("Matching", count), *shown],
            back=back,
            can_confirm=bool(matching),
        )
    changed = await c.services.operations.requeue(where=form.filter, now=c.now(), actor=ACTOR)
    # The recipient stays out of the log line: addresses are personal data.
    logged = {f"filter_{k}": v for k, v in form.values.items() if v and k != "to"}
    log.info("console_bulk_requeue", requeued=len(changed), actor=ACTOR, **logged)
    return c.redirect(back, flash=f"Requeued {_messages(len(changed))}.")


def _messages(n: int) -> str:
    return f"{n} message" if n == 1 else f"{n} messages"


async def _tenant(c: Console) -> str:
    """The id of the tenant the form names (by id or name); UnknownTenant if none."""
    tenant = c.form.get("tenant", "").strip()
    if not tenant or len(tenant) > TENANT_ID_MAX:
        raise ConsoleError(
            400, "Tenant required", f"A tenant's id or name, 1 to {TENANT_ID_MAX} characters."
        )
    return await c.tenant_id(tenant)


async def suppress(c: Console) -> Response:
    tenant = await _tenant(c)
    shown = c.tenant_label(tenant)
    try:
        email = normalize_address(c.form.get("email", "").strip())
    except EmailNotValidError as exc:
        raise ConsoleError(400, "Invalid address", f"Not an email address: {exc}") from None
    note = c.form.get("detail", "").strip()[:ERROR_MAX]
    if not c.confirmed:
        return confirm(
            c,
            title="Suppress this address?",
            question="Emails to it from this tenant fail at once, without being sent, "
            "until the suppression is removed.",
            action="/admin/suppressions/add",
            fields={"tenant": tenant, "email": email, "detail": note},
            details=[
                ("Tenant", shown),
                ("Email", email),
                ("Reason", "manual"),
                *([("Note", note)] if note else []),
            ],
            back="/admin/suppressions",
        )
    added = await c.services.operations.suppress(
        tenant_id=tenant, email=email, now=c.now(), reason="manual", detail=note or None
    )
    log.info("console_suppress", tenant=tenant, added=added, actor=ACTOR)
    done = "Suppressed {} for {}." if added else "{} was already suppressed for {}."
    return c.redirect("/admin/suppressions", flash=done.format(email, shown))


async def unsuppress(c: Console) -> Response:
    tenant = await _tenant(c)
    shown = c.tenant_label(tenant)
    # Removed as listed, unvalidated: an address a bounce stored must stay removable.
    email = c.form.get("email", "").strip()
    if not email:
        raise ConsoleError(400, "Email required", "Which address should be sent to again?")
    if not c.confirmed:
        return confirm(
            c,
            title="Remove this suppression?",
            question="Emails to this address from this tenant will be sent again.",
            action="/admin/suppressions/remove",
            fields={"tenant": tenant, "email": email},
            details=[("Tenant", shown), ("Email", email)],
            back="/admin/suppressions",
        )
    removed = await c.services.operations.unsuppress(tenant_id=tenant, email=email)
    log.info("console_unsuppress", tenant=tenant, removed=removed, actor=ACTOR)
    done = "Removed the suppression of {} for {}." if removed else "{} was not suppressed for {}."
    return c.redirect("/admin/suppressions", flash=done.format(email, shown))
