"""Sender domains in the console: each domain's readiness at its last check, what each of
its DNS records was found to be (with the fix), the records to publish, and a button that
checks DNS again now (a check writes nothing but its result, so it needs no second POST).
The service is the CLI's and the admin API's (services/sender_domains.py); adding, rotating
and removing keys stay with them, where a private key file can be given."""

from __future__ import annotations

import structlog
from starlette.responses import Response

from mailbag.console.context import Console, ConsoleError
from mailbag.services.sender_domains import InvalidDomain, SenderDomains, UnknownDomain

log = structlog.get_logger("mailbag.console")
PAGE = "/admin/domains"


async def page(c: Console) -> Response:
    """Every sender domain, those not ready first."""
    found = await SenderDomains(c.services.engine, c.services.settings).listing()
    found.sort(key=lambda d: (d.ready is True, d.tenant_id, d.domain))
    rows = [(d, c.tenant_label(d.tenant_id)) for d in found]
    return c.page("domains.html", domains=rows)


async def check(c: Console) -> Response:
    tenant, domain = c.form.get("tenant", ""), c.form.get("domain", "")
    domains = SenderDomains(c.services.engine, c.services.settings)
    try:
        shown = await domains.check(tenant, domain, now=c.now())
    except (InvalidDomain, UnknownDomain) as exc:
        raise ConsoleError(404, "No such domain", f"Nothing was checked: {exc}.") from None
    log.info("console_domain_check", tenant=shown.tenant_id, domain=shown.domain, ready=shown.ready)
    return c.redirect(PAGE, flash=f"Checked {shown.domain}: {shown.state}.")
