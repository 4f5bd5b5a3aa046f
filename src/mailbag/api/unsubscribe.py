"""`/v1/unsubscribe/{token}`: mailbag's own one-click unsubscribe (RFC 8058), the link a bulk
message carries in List-Unsubscribe when it brings none of its own (domain/bulk.py).

A mailbox provider POSTs `List-Unsubscribe=One-Click` to it when its user clicks
"unsubscribe": the address is suppressed for the tenant whose mail it was (reason
`unsubscribed`), and 200 answers, also when it already was. A person who opens the link in
a browser GETs a page with one button that POSTs the same. The token is the only
credential: it signs (tenant, address, message id) under a subkey of SECRET_KEY, so a
link can unsubscribe its own recipient and nobody else. Without PUBLIC_URL no link is made
and this answers 404; a token that is not this deployment's is a 404 too. No key, no CSRF
(the provider's POST carries no cookie), nothing else written.
"""

from __future__ import annotations

from html import escape
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import HTMLResponse

from mailbag.api.deps import NowDep, ServicesDep
from mailbag.api.problems import documented, not_found
from mailbag.domain.bulk import UNSUBSCRIBE_PATH, BadToken, Unsubscriber
from mailbag.services.container import Services

router = APIRouter(prefix=UNSUBSCRIBE_PATH, tags=["unsubscribe"])
RESPONSES = documented(404, 413, 422, 500, 503)
Token = Annotated[str, Path(max_length=2000, description="The token of a List-Unsubscribe link.")]
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Unsubscribe</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body style="font-family: sans-serif; max-width: 32rem; margin: 3rem auto">
{body}
</body></html>
"""


def _who(svc: Services, token: str) -> Unsubscriber:
    links = svc.settings.unsubscribe_links
    if links is None:
        raise not_found("this deployment makes no unsubscribe links (PUBLIC_URL is not set)")
    try:
        return links.read(token)
    except BadToken as exc:
        raise not_found(str(exc)) from None


@router.get("/{token}", response_class=HTMLResponse, responses=RESPONSES)
async def ask(token: Token, svc: ServicesDep) -> HTMLResponse:
    """The page a person sees who opens the link: one button, no script."""
    who = _who(svc, token)
    body = (
        f"<h1>Unsubscribe</h1><p>Stop these emails to <strong>{escape(who.address)}</strong>?"
        f'</p><form method="post" action="{UNSUBSCRIBE_PATH}/{escape(token)}">'
        '<input type="hidden" name="List-Unsubscribe" value="One-Click">'
        '<button type="submit">Unsubscribe</button></form>'
    )
    return HTMLResponse(PAGE.format(body=body), headers={"Cache-Control": "no-store"})


@router.post("/{token}", response_class=HTMLResponse, responses=RESPONSES)
async def unsubscribe(token: Token, svc: ServicesDep, now: NowDep) -> HTMLResponse:
    """One-click (RFC 8058): the address is suppressed for the tenant; 200 every time."""
    who = _who(svc, token)
    await svc.operations.suppress(
        tenant_id=who.tenant_id,
        email=who.address,
        now=now,
        reason="unsubscribed",
        detail=f"one-click unsubscribe (message {who.message_id})",
    )
    body = f"<h1>Unsubscribed</h1><p>{escape(who.address)} gets no more of these emails.</p>"
    return HTMLResponse(PAGE.format(body=body), headers={"Cache-Control": "no-store"})
