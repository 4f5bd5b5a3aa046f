"""The FastAPI application: routes, problem+json errors, request ids, body limits."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib.metadata import version as package_version

import structlog
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mailbag import console, log, metrics
from mailbag.api import (
    admin,
    batch,
    docs,
    health,
    hooks,
    messages,
    scrape,
    templates,
    unsubscribe,
    verifications,
    webhooks,
)
from mailbag.api.deadline import DatabaseDeadline
from mailbag.api.intake_limits import BodyLimit, InFlight, Pace
from mailbag.api.problems import (
    ProblemError,
    install_error_handlers,
    internal_error,
    problem_for,
)
from mailbag.clock import Clock, utcnow
from mailbag.domain import storable
from mailbag.services import hooks as hook_service
from mailbag.services import intake
from mailbag.services import messages as message_service
from mailbag.services import verification as verification_service
from mailbag.services.container import Services
from mailbag.services.erasure import engine_options
from mailbag.services.operations import Operations
from mailbag.settings import Settings, read_settings
from mailbag.store.database import make_async_engine

JSON_BODY_PATHS = ("/v1/messages", "/v1/email-verifications")


def create_app(settings: Settings | None = None, *, clock: Clock = utcnow) -> FastAPI:
    settings = settings or read_settings()
    log.configure(settings.log_level)
    metrics.configure(tenant_labels=settings.metrics_tenant_labels)
    app = FastAPI(
        title="mailbag",
        version=package_version("mailbag"),
        description="Transactional email through an outbox: idempotent sends and email "
        "verification. Authenticate with `Authorization: Bearer <tenant API key>`; errors "
        "are RFC 9457 problem+json.",
        lifespan=_services_while_serving(settings, clock),
        dependencies=[Depends(storable_parameters)],
        docs_url=None,  # served by docs.install from the installed packages, not a CDN
        redoc_url=None,
    )
    docs.install(app)
    _install_routes(app, settings)
    install_error_handlers(app)
    _install_middleware(app, settings)
    return app


def _services_while_serving(
    settings: Settings, clock: Clock
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: its Services (one engine, the use cases) while it serves."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # No pre-ping: a round trip before every request's statement. After a database
        # restart the first request on a dead connection answers 503 (Retry-After) and
        # SQLAlchemy drops the pool's connections of that age, so the next ones reconnect.
        engine = make_async_engine(
            settings.database_url,
            pool_size=settings.api_pool_size,
            timeout=settings.database_timeout_seconds,
            statement_timeout=settings.database_timeout_seconds,
            pre_ping=False,
            execution_options=engine_options(settings),
        )
        app.state.services = Services(
            settings=settings,
            engine=engine,
            clock=clock,
            messages=message_service.Messages(engine, settings),
            verifications=verification_service.Verifications(engine, settings),
            operations=Operations(engine, default_attempts=settings.max_attempts),
            hooks=hook_service.Hooks(engine, settings),
            catalog=intake.load_catalog(settings.templates_dir),  # the one Rules read
        )
        try:
            yield
        finally:
            await engine.dispose()

    return lifespan


def _install_routes(app: FastAPI, settings: Settings) -> None:
    app.include_router(messages.router)
    app.include_router(batch.router)
    app.include_router(verifications.router)
    app.include_router(templates.router)
    if settings.admin_password is not None:
        app.include_router(console.router(settings))
    app.include_router(webhooks.router)
    app.include_router(admin.router)
    app.include_router(hooks.router)
    app.include_router(health.router)
    app.include_router(unsubscribe.router)
    scrape.install(app, settings.metrics_cache_seconds)
    app.state.sns_certificates = webhooks.SnsCertificates(settings.sns_cert_hosts)
    app.state.confirm_subscription = webhooks.confirm_subscription


def _install_middleware(app: FastAPI, settings: Settings) -> None:
    """Outermost last: the request context, then body limits, then the database deadline."""
    app.add_middleware(DatabaseDeadline, seconds=settings.database_timeout_seconds)
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_body_bytes,
        # A message carries its attachments in the body: it may be as large as they need,
        # once the request has shown its key.
        larger={
            ("POST", "/v1/messages"): settings.message_body_bytes,
            ("POST", "/v1/messages/batch"): settings.message_body_bytes,  # the items together
        },
        in_flight=InFlight.from_settings(settings),  # this app's: one per process
        pace=Pace.from_settings(settings),
        problems=problem_for,
    )
    app.add_middleware(RequestContext)


def app_from_environment() -> FastAPI:
    """For `uvicorn --factory`: every uvicorn worker process builds its app from settings
    (InvalidSettings names a bad one, never its value)."""
    return create_app(read_settings())


class RequestContext:
    """A request id on every log line and response, and one access line for every request,
    a 500 included: nothing raised inside gets past this middleware. An unhandled error is
    logged without its message (it may quote the request) and answered with a problem."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        request_id = headers.get("x-request-id", "")[:100] or uuid.uuid4().hex
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        started = time.perf_counter()
        status: int | None = None

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            await send(message)

        app = self.app
        if _not_json(scope, headers):
            app = ProblemError(
                415,
                "unsupported-media-type",
                "Unsupported media type",
                "send the body as application/json",
            ).response()
        try:
            await app(scope, receive, send_with_id)
        except Exception as exc:
            answer = internal_error(exc).response()
            if status is None:  # else the answer had begun: the server drops the connection
                await answer(scope, receive, send_with_id)
        finally:
            log.get("mailbag.api").info(
                "request",
                method=scope["method"],
                path=scope["path"],
                status=status,
                duration_ms=round((time.perf_counter() - started) * 1000, 2),
            )


def _not_json(scope: Scope, headers: Headers) -> bool:
    has_body = headers.get("content-length") not in (None, "0") or "transfer-encoding" in headers
    return (
        scope["method"] == "POST"
        and scope["path"].startswith(JSON_BODY_PATHS)
        and has_body
        and "json" not in headers.get("content-type", "")
    )


async def storable_parameters(request: Request) -> None:
    """Query and path parameters follow the bodies' rule (domain.storable): a NUL in one
    would reach a WHERE clause that PostgreSQL refuses, a 500 instead of a 422."""
    errors = [
        {"type": "unstorable_text", "loc": (where, name), "msg": problem}
        for where, items in (
            ("path", request.path_params.items()),
            ("query", request.query_params.multi_items()),
        )
        for name, value in items
        if isinstance(value, str) and (problem := storable.text_problem(value)) is not None
    ]
    if errors:
        raise RequestValidationError(errors)
