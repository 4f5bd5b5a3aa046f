"""Tenants in the console: the list, and each tenant's page with its own provider account
(its kind and which settings it sets, never a value), set or replaced by one form and
removed after a confirmation (every POST carries the session's CSRF token: routes.py).

A secret typed into the form travels once, in the POST that seals it: the form is never
filled in again, an error names the setting and never echoes what was typed, and the
removal's confirmation carries no settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from starlette.responses import Response

from mailbag import log as logs
from mailbag.console.actions import confirm
from mailbag.console.context import ACTOR, Console, ConsoleError
from mailbag.domain.message import TENANT_ID_MAX
from mailbag.services.tenant_accounts import (
    AccountView,
    InvalidAccount,
    NoAccount,
    NoAccountKey,
    TenantAccounts,
    UnreadableAccount,
    parse_pairs,
)
from mailbag.services.tenants import UnknownTenant

log = logs.get("mailbag.console")
SETTINGS_FIELD_MAX = 10_000  # characters of the settings box


def tenant_url(tenant_id: str) -> str:
    return f"/admin/tenants/{quote(tenant_id, safe='')}"


def _accounts(c: Console) -> TenantAccounts:
    return TenantAccounts(c.services.engine, c.services.settings)


async def path_tenant_id(c: Console) -> str:
    """The id of the tenant of the page's path (its id or its name); 404 if none."""
    typed = c.request.path_params["tenant_id"]
    missing = ConsoleError(404, "Not found", "No tenant has this id or name.")
    if len(typed) > TENANT_ID_MAX:
        raise missing
    try:
        return await c.tenant_id(typed)
    except UnknownTenant:
        raise missing from None


async def tenants_page(c: Console) -> Response:
    """Every tenant, with the kind of its own account if it has one."""
    kinds = {a.tenant_id: a.kind for a in await _accounts(c).listing()}
    return c.page("tenants.html", kinds=kinds)


async def _account(c: Console, tenant_id: str) -> tuple[AccountView | None, str | None]:
    """The tenant's own account, or why it cannot be shown."""
    try:
        return await _accounts(c).show(tenant_id), None
    except NoAccount:
        return None, None
    except (NoAccountKey, UnreadableAccount) as exc:
        return None, str(exc)


async def _page(c: Console, tenant_id: str, *, status: int = 200, error: str = "") -> Response:
    from mailbag.providers import available

    account, problem = await _account(c, tenant_id)
    return c.page(
        "tenant.html",
        status=status,
        tenant_id=tenant_id,
        url=tenant_url(tenant_id),
        account=account,
        problem=problem,
        error=error,
        kinds=available(),
        chosen=c.form.get("kind", account.kind if account else ""),
    )


async def tenant_page(c: Console) -> Response:
    """One tenant: its id and name, and its own account."""
    return await _page(c, await path_tenant_id(c))


def _settings(form: Mapping[str, str]) -> dict[str, str]:
    text = form.get("settings", "")
    if len(text) > SETTINGS_FIELD_MAX:
        raise InvalidAccount(f"settings: more than {SETTINGS_FIELD_MAX} characters")
    return parse_pairs(text.splitlines(), "settings line", trim=True)


async def set_account(c: Console) -> Response:
    """Give the tenant its own account, or replace it, with the form's kind and settings."""
    tenant_id = await path_tenant_id(c)
    try:
        shown, created = await _accounts(c).put(
            tenant_id, c.form.get("kind", "").strip(), _settings(c.form), now=c.now(), actor=ACTOR
        )
    except (InvalidAccount, NoAccountKey) as exc:  # named, never echoed; nothing was stored
        return await _page(c, tenant_id, status=400, error=f"Nothing was changed: {exc}.")
    log.info("console_tenant_account_set", tenant=tenant_id, kind=shown.kind, actor=ACTOR)
    verb = "Gave" if created else "Replaced"
    flash = f"{verb} {c.tenant_label(tenant_id)} its own {shown.kind} account."
    return c.redirect(tenant_url(tenant_id), flash=flash)


async def remove_account(c: Console) -> Response:
    tenant_id = await path_tenant_id(c)
    back = tenant_url(tenant_id)
    if not c.confirmed:
        return confirm(
            c,
            title="Remove this tenant's own account?",
            question="Routes that name `tenant` have no account of this tenant's own to "
            "send its mail through any more. Its settings are deleted, not kept.",
            action=f"{back}/account/remove",
            fields={},
            details=[("Tenant", c.tenant_label(tenant_id))],
            back=back,
        )
    try:
        await _accounts(c).remove(tenant_id)
    except NoAccount as exc:  # removed meanwhile
        raise ConsoleError(409, "Not possible now", f"Nothing was changed: {exc}.") from None
    log.info("console_tenant_account_removed", tenant=tenant_id, actor=ACTOR)
    return c.redirect(back, flash=f"Removed {c.tenant_label(tenant_id)}'s own account.")
