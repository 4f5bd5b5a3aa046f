"""What every console handler gets: the request, the operator's session, the posted form."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from mailbag import web
from mailbag.console import auth, render
from mailbag.services import tenants
from mailbag.services.container import Services

ACTOR = "operator:console"  # the actor of every audit event an action writes


class ConsoleError(Exception):
    """Shown to the operator as a page with this status; nothing was changed."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail


@dataclass(frozen=True)
class Console:
    request: Request
    gate: auth.Gate
    session: auth.ConsoleSession
    form: Mapping[str, str]  # the POSTed fields, CSRF already checked; empty on GET
    # Every tenant's name by id, read once per request: pages show names beside ids.
    tenant_names: Mapping[str, str] = field(default_factory=dict)

    @property
    def services(self) -> Services:
        return web.services(self.request)

    def now(self) -> datetime:
        return self.services.clock()

    async def tenant_id(self, tenant: str) -> str:
        """The id of the tenant an operator typed (its id or its name); UnknownTenant if
        none has it (the same resolution as the command line's and the admin API's)."""
        return await tenants.resolve_async(self.services.engine, tenant)

    def tenant_label(self, tenant_id: str) -> str:
        return render.tenant_label(tenant_id, self.tenant_names)

    @property
    def confirmed(self) -> bool:
        """The second POST of an action: the operator pressed the confirm button."""
        return self.form.get("confirm") == "yes"

    def page(self, template: str, *, status: int = 200, **context: Any) -> Response:
        flash = self.gate.read_flash(self.request)
        response = render.html(
            template,
            status=status,
            csrf=self.session.csrf,
            flash=flash,
            path=self.request.url.path,
            tenant_names=self.tenant_names,
            **context,
        )
        if auth.FLASH_COOKIE in self.request.cookies:
            auth.forget_flash(response)
        return response

    def error(self, exc: ConsoleError) -> Response:
        return self.page("error.html", status=exc.status, title=exc.title, detail=exc.detail)

    def redirect(self, url: str, *, flash: str | None = None) -> Response:
        response = RedirectResponse(url, status_code=303, headers=render.SECURITY_HEADERS)
        if flash is not None:
            self.gate.set_flash(self.request, response, flash)
        return response


Handler = Callable[[Console], Awaitable[Response]]
