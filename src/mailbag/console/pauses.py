"""Pauses in the console: what is paused (the fleet, a provider, a tenant), since when, by
whom and why, with a form to pause and a button to resume each (two POSTs, as every
console action: the first asks, the second does it). The service is the CLI's and the
admin API's (services/pauses.py)."""

from __future__ import annotations

import structlog
from starlette.responses import Response

from mailbag.console.actions import confirm
from mailbag.console.context import ACTOR, Console, ConsoleError
from mailbag.console.render import utc
from mailbag.console.views import pause_label
from mailbag.services.pauses import (
    SCOPES,
    InvalidPause,
    NotPaused,
    Pauses,
    age_seconds,
    checked_reason,
    parse_scope,
)
from mailbag.store.fleet_state import Pause, Scope

log = structlog.get_logger("mailbag.console")
PAGE = "/admin/pauses"
# What a pause does, said on the page that asks before it pauses.
EFFECTS = {
    Scope.FLEET: "No worker claims any mail until it is resumed; sends already under way "
    "finish. Nothing is lost and no attempt is spent: mail waits.",
    Scope.PROVIDER: "Mail routed to it goes to the next provider of its route, or waits "
    "(no attempt spent) until it is resumed.",
    Scope.TENANT: "Its mail is not claimed until it is resumed (no attempt spent); other "
    "tenants' mail goes on.",
}


def _scope(c: Console) -> Scope:
    try:
        return parse_scope(c.form.get("scope", ""))
    except InvalidPause as exc:
        raise ConsoleError(400, "Invalid pause", f"Nothing was changed: {exc}.") from None


async def _target(c: Console, scope: Scope) -> str:
    try:
        return await Pauses(c.services.engine).target(scope, c.form.get("target", ""))
    except InvalidPause as exc:
        raise ConsoleError(400, "Invalid pause", f"Nothing was changed: {exc}.") from None


def _target_cell(c: Console, p: Pause) -> str:
    if p.scope is Scope.TENANT:
        return c.tenant_label(p.target)
    return p.target or "—"


async def paused(c: Console) -> Response:
    """Every pause in force, oldest first, and the form that pauses."""
    now = c.now()
    found = await Pauses(c.services.engine).listing()
    rows = [(p, _target_cell(c, p), age_seconds(p, now)) for p in found]
    return c.page("pauses.html", pauses=rows, scopes=SCOPES)


async def pause(c: Console) -> Response:
    scope = _scope(c)
    target = await _target(c, scope)
    try:
        reason = checked_reason(c.form.get("reason"))
    except InvalidPause as exc:
        raise ConsoleError(400, "Invalid pause", f"Nothing was changed: {exc}.") from None
    shown = pause_label(c, scope, target)
    if not c.confirmed:
        return confirm(
            c,
            title=f"Pause {shown}?",
            question=EFFECTS[scope],
            action=f"{PAGE}/pause",
            fields={"scope": scope.value, "target": target, "reason": reason or ""},
            details=[("Pause", shown), *([("Reason", reason)] if reason else [])],
            back=PAGE,
        )
    done = await Pauses(c.services.engine).pause(
        scope, target, now=c.now(), actor=ACTOR, reason=reason
    )
    log.info("console_pause", scope=scope.value, target=target, new=done.new, actor=ACTOR)
    p = done.pause
    if done.new:
        flash = f"Paused {shown}: its mail waits until it is resumed."
    else:
        flash = f"{shown} was already paused, since {utc(p.paused_at)} by {p.paused_by}."
    return c.redirect(PAGE, flash=flash[0].upper() + flash[1:])


async def resume(c: Console) -> Response:
    scope = _scope(c)
    target = await _target(c, scope)
    shown = pause_label(c, scope, target)
    if not c.confirmed:
        return confirm(
            c,
            title=f"Resume {shown}?",
            question="Its mail goes out again: every worker sees the resume within a poll "
            "interval.",
            action=f"{PAGE}/resume",
            fields={"scope": scope.value, "target": target},
            details=[("Resume", shown)],
            back=PAGE,
        )
    try:
        await Pauses(c.services.engine).resume(scope, target)
    except NotPaused as exc:  # resumed by someone else between the two POSTs
        raise ConsoleError(409, "Not possible now", f"Nothing was changed: {exc}.") from None
    log.info("console_resume", scope=scope.value, target=target, actor=ACTOR)
    return c.redirect(PAGE, flash=f"Resumed {shown}.")
