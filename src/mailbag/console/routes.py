"""The console's routes under /admin, and the one gate every request passes through."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from urllib.parse import quote

import structlog
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from mailbag.console import (
    actions,
    attachments,
    auth,
    domains,
    hooks,
    pauses,
    render,
    views,
)
from mailbag.console import templates_editor as templates
from mailbag.console import tenants as tenant_pages
from mailbag.console.context import Console, ConsoleError, Handler
from mailbag.console.forms import BadForm, read_form
from mailbag.services import tenants
from mailbag.services.operations import NotAllowed
from mailbag.settings import Settings
from mailbag.web import client_address, services

log = structlog.get_logger("mailbag.console")
Endpoint = Callable[[Request], Awaitable[Response]]

PAGES: list[tuple[str, Handler]] = [
    ("", views.overview),
    ("/messages", views.messages),
    ("/messages/{message_id}", views.message),
    ("/messages/{message_id}/attachments/{position}", attachments.download),
    ("/suppressions", views.suppressions),
    ("/tenants", tenant_pages.tenants_page),
    ("/tenants/{tenant_id}", tenant_pages.tenant_page),
    ("/templates", templates.templates_tenants),
    ("/tenants/{tenant_id}/templates", templates.templates_index),
    ("/tenants/{tenant_id}/templates/new", templates.template_new),
    ("/tenants/{tenant_id}/templates/{name}/{locale}", templates.template_page),
    ("/tenants/{tenant_id}/templates/{name}/{locale}/diff", templates.template_diff),
    ("/static/template-editor.js", templates.template_script),
    ("/hooks", hooks.page),
    ("/hooks/deliveries/{delivery_id}", hooks.delivery),
    ("/pauses", pauses.paused),
    ("/domains", domains.page),
]
ACTIONS: list[tuple[str, Handler]] = [
    ("/messages/bulk-requeue", actions.bulk_requeue),
    ("/messages/{message_id}/requeue", actions.requeue),
    ("/messages/{message_id}/cancel", actions.cancel),
    ("/messages/{message_id}/resolve", actions.resolve),
    ("/suppressions/add", actions.suppress),
    ("/suppressions/remove", actions.unsuppress),
    ("/tenants/{tenant_id}/account", tenant_pages.set_account),
    ("/tenants/{tenant_id}/account/remove", tenant_pages.remove_account),
    ("/tenants/{tenant_id}/templates/{name}/{locale}/preview", templates.template_preview),
    ("/tenants/{tenant_id}/templates/{name}/{locale}/live", templates.template_live),
    ("/tenants/{tenant_id}/templates/{name}/{locale}/publish", templates.template_publish),
    ("/tenants/{tenant_id}/templates/{name}/{locale}/rollback", templates.template_rollback),
    ("/hooks/deliveries/{delivery_id}/replay", hooks.replay),
    ("/pauses/pause", pauses.pause),
    ("/pauses/resume", pauses.resume),
    ("/domains/check", domains.check),
]
# Where a login may lead: console pages only, never another site ("//evil.example").
_LOCAL_NEXT = re.compile(r"^/admin(/[^/\\][^\\\s]*)?(\?[^\s]*)?$")


def router(settings: Settings) -> APIRouter:
    if settings.admin_password is None:
        raise ValueError("the console needs ADMIN_PASSWORD")
    # The signing key comes from the deployment key: a missing one stops the start here.
    gate = auth.Gate(settings.admin_password.get_secret_value(), settings.key)
    routes = APIRouter(prefix="/admin", include_in_schema=False)

    async def login_page(request: Request) -> Response:
        return await _login_page(gate, request)

    async def login(request: Request) -> Response:
        return await _login(gate, request)

    routes.add_api_route("/login", login_page, methods=["GET"])
    routes.add_api_route("/login", login, methods=["POST"])
    routes.add_api_route("/logout", _guarded(gate, _logout), methods=["POST"], name="logout")
    for path, handler in PAGES:
        routes.add_api_route(path, _guarded(gate, handler), methods=["GET"], name=handler.__name__)
    for path, handler in ACTIONS:
        routes.add_api_route(
            path, _guarded(gate, handler), methods=["POST"], name=f"{handler.__name__}_action"
        )
    return routes


def _guarded(gate: auth.Gate, handler: Handler) -> Endpoint:
    """Log-in required; every POST must carry the session's CSRF token; errors as pages."""

    async def endpoint(request: Request) -> Response:
        session = await gate.read(request)
        if session is None or not session.authenticated:
            wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            target = wanted if request.method == "GET" else "/admin"
            return RedirectResponse(f"/admin/login?next={quote(target, safe='/')}", status_code=303)
        names = await tenants.names(services(request).engine)
        c = Console(request, gate, session, {}, names)
        try:
            if request.method == "POST":
                form = await read_form(request)
                if not gate.csrf_matches(session, form.get("csrf")):
                    log.warning("console_csrf_rejected", path=request.url.path)
                    raise ConsoleError(
                        403,
                        "Forbidden",
                        "The form's security token is missing or out of date. "
                        "Go back, reload the page and try again.",
                    )
                c = Console(request, gate, session, form, names)
            return await handler(c)
        except BadForm as exc:
            return c.error(ConsoleError(400, "Bad request", str(exc)))
        except ConsoleError as exc:
            return c.error(exc)
        except NotAllowed as exc:
            return c.error(ConsoleError(409, "Not possible now", f"Nothing was changed: {exc}."))
        except tenants.UnknownTenant as exc:  # a tenant typed into an action's form
            return c.error(ConsoleError(400, "Unknown tenant", f"Nothing was changed: {exc}."))

    return endpoint


async def _logout(c: Console) -> Response:
    response = c.redirect("/admin/login")
    await c.gate.log_out(c.request, response, c.session)
    log.info("console_logout")
    return response


def _next(request: Request, form: dict[str, str] | None = None) -> str:
    wanted = (form or {}).get("next") or request.query_params.get("next", "")
    return wanted if _LOCAL_NEXT.match(wanted) else "/admin"


async def _login_page(gate: auth.Gate, request: Request) -> Response:
    session = await gate.read(request)
    if session is not None and session.authenticated:
        return RedirectResponse(_next(request), status_code=303)
    # An anonymous session carries the login form's CSRF token, and nothing else.
    session = session or gate.anonymous()
    response = render.html("login.html", csrf=session.csrf, next=_next(request), error=None)
    gate.write(request, response, session)
    return response


async def _login(gate: auth.Gate, request: Request) -> Response:
    session = await gate.read(request)
    try:
        form = await read_form(request)
    except BadForm:
        form = {}
    if session is None or not gate.csrf_matches(session, form.get("csrf")):
        fresh = gate.anonymous()
        response = render.html(
            "login.html",
            status=403,
            csrf=fresh.csrf,
            next=_next(request, form),
            error="The login form expired. Please try again.",
        )
        gate.write(request, response, fresh)
        return response
    client = client_address(request)
    failures = services(request).login_failures
    wait = failures.retry_after(client)
    if wait is not None:  # the password is not even checked: no guess gets an answer
        log.warning("console_login_throttled", client=client)
        response = render.html(
            "login.html",
            status=429,
            csrf=session.csrf,
            next=_next(request, form),
            error=f"Too many failed logins. Try again in {wait} seconds.",
        )
        response.headers["Retry-After"] = str(wait)
        return response
    if not gate.password_matches(form.get("password")):
        failures.failed(client)
        log.warning("console_login_failed", client=client)
        return render.html(
            "login.html",
            status=401,
            csrf=session.csrf,
            next=_next(request, form),
            error="Login failed.",
        )
    log.info("console_login", client=client)
    success = RedirectResponse(_next(request, form), status_code=303)
    await gate.log_in(request, success)
    return success
