"""The FastAPI application: routes, problem+json errors, request ids, body limits."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import structlog
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mailbag import console, log, metrics, runtime, templates
from mailbag.api import admin, batch, docs, hooks, messages, scrape, verifications, webhooks
from mailbag.api.deadline import RETRY_AFTER_SECONDS, DatabaseDeadline, database_unavailable
from mailbag.api.problems import ProblemError
from mailbag.clock import Clock, utcnow
from mailbag.domain import storable
from mailbag.domain.message import InvalidMessage, MessageTooLarge
from mailbag.services import idempotency
from mailbag.services import messages as message_service
from mailbag.services import tenants as tenant_service
from mailbag.services import verification as verification_service
from mailbag.services.container import Services
from mailbag.services.operations import NotAllowed, Operations
from mailbag.settings import Settings
from mailbag.store import migrate
from mailbag.store.database import make_async_engine

JSON_BODY_PATHS = ("/v1/messages", "/v1/email-verifications")
DATABASE_DOWN = (OperationalError, PoolTimeout, ConnectionError, OSError, TimeoutError)


def create_app(settings: Settings | None = None, *, clock: Clock = utcnow) -> FastAPI:
    settings = settings or Settings()
    log.configure(settings.log_level)
    runtime.configure_hooks(settings)
    metrics.configure(tenant_labels=settings.metrics_tenant_labels)

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
        )
        catalog = templates.load(settings.templates_dir)
        app.state.services = Services(
            settings=settings,
            engine=engine,
            clock=clock,
            messages=message_service.Messages(engine, settings),
            verifications=verification_service.Verifications(engine, settings),
            operations=Operations(engine, default_attempts=settings.max_attempts),
            catalog=catalog,
        )
        try:
            yield
        finally:
            await engine.dispose()

    app = FastAPI(
        title="mailbag",
        version="0.1.0",
        description="Transactional email through an outbox: idempotent sends and email "
        "verification. Authenticate with `Authorization: Bearer <tenant API key>`; errors "
        "are RFC 9457 problem+json.",
        lifespan=lifespan,
        dependencies=[Depends(storable_parameters)],
        docs_url=None,  # served by docs.install from the installed packages, not a CDN
        redoc_url=None,
    )
    docs.install(app)
    app.include_router(messages.router)
    app.include_router(batch.router)
    app.include_router(verifications.router)
    if settings.admin_password is not None:
        app.include_router(console.router(settings))
    app.include_router(webhooks.router)
    app.include_router(admin.router)
    app.include_router(hooks.router)
    scrape.install(app, settings.metrics_cache_seconds)
    app.state.sns_certificates = webhooks.SnsCertificates(settings.sns_cert_hosts)
    app.state.confirm_subscription = webhooks.confirm_subscription
    install_error_handlers(app)
    app.add_middleware(DatabaseDeadline, seconds=settings.database_timeout_seconds)
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_body_bytes,
        # A message carries its attachments in the body: it may be as large as they need.
        larger={
            ("POST", "/v1/messages"): settings.message_body_bytes,
            ("POST", "/v1/messages/batch"): settings.message_body_bytes,  # the items together
        },
    )
    app.add_middleware(RequestContext)

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"], responses={503: {"description": "Not ready."}})
    async def readyz(request: Request) -> Response:
        """The database is reachable and its schema is current."""
        svc: Services = request.app.state.services
        try:
            async with svc.engine.connect() as conn:
                current = await conn.run_sync(lambda sync: migrate.is_current(sync))
        except DATABASE_DOWN as exc:
            return JSONResponse(
                {"status": "database unreachable", "error": type(exc).__name__},
                status_code=503,
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        if not current:
            return JSONResponse({"status": "schema not current"}, status_code=503)
        return JSONResponse({"status": "ready"})

    return app


def app_from_environment() -> FastAPI:
    """For `uvicorn --factory`: every uvicorn worker process builds its app from settings."""
    return create_app(Settings())


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


def internal_error(exc: BaseException) -> ProblemError:
    """Log an unhandled error (its types and frames, never its message): a 500."""
    log.get("mailbag.api").error("unhandled_error", **log.exception_fields(exc))
    return ProblemError(
        500,
        "internal-error",
        "Internal server error",
        "the error was logged with this request's id",
    )


class BodyLimit:
    """Refuse bodies over the limit (413), declared or streamed (chunked), before the app
    sees any of it. A declared length is refused unread; any other body is read here, up
    to the limit, and handed on whole. (Stopping the app's own read midway does not work:
    FastAPI turns an error while reading the body into a 400.) `larger` gives some
    (method, path)s a limit of their own."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, larger: dict[tuple[str, str], int] | None = None
    ) -> None:
        self.app, self.max_bytes, self.larger = app, max_bytes, larger or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.larger.get((scope["method"], scope["path"].rstrip("/")), self.max_bytes)
        declared = Headers(scope=scope).get("content-length")
        too_large = ProblemError(
            413, "body-too-large", "Request body too large", f"the limit is {limit} bytes"
        ).response()
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await too_large(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away: nobody to answer
            body += message.get("body", b"")
            if len(body) > limit:
                await too_large(scope, receive, send)
                return
            more = message.get("more_body", False)
        whole: list[Message] = [{"type": "http.request", "body": bytes(body), "more_body": False}]

        async def replay() -> Message:
            return whole.pop() if whole else await receive()

        await self.app(scope, replay, send)


def _tenant() -> str:
    bound: dict[str, Any] = structlog.contextvars.get_contextvars()
    return str(bound.get("tenant", "unknown"))


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    # Pydantic echoes the offending input; a token or key must not come back in an error.
    return [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")}
        for e in exc.errors()
    ]


@dataclass(frozen=True)
class ProblemType:
    """The answer to one kind of error. The detail is the exception's message unless one is
    given; `fields` and `headers` take the exception's particulars."""

    status: int
    slug: str
    title: str
    detail: str | None = None
    fields: Callable[[Any], dict[str, Any]] = lambda exc: {}
    headers: Callable[[Any], dict[str, str]] = lambda exc: {}

    def __call__(self, exc: Exception) -> ProblemError:
        detail = self.detail if self.detail is not None else str(exc)
        return ProblemError(
            self.status,
            self.slug,
            self.title,
            detail,
            headers=self.headers(exc),
            **self.fields(exc),
        )


def _invalid_request(exc: RequestValidationError) -> ProblemError:
    errors = _validation_errors(exc)
    if any(e["type"] == "json_invalid" for e in errors):
        return ProblemError(400, "invalid-json", "Invalid JSON", "the body is not valid JSON")
    return ProblemError(
        422,
        "validation-error",
        "Invalid request",
        "the request does not match the schema",
        errors=errors,
    )


def _key_reused(exc: idempotency.KeyReused) -> ProblemError:
    metrics.FINGERPRINT_CONFLICTS.labels(metrics.tenant_label(_tenant())).inc()
    return ProblemError(
        409,
        "idempotency-key-reused",
        "Idempotency-Key reused",
        str(exc),
        first_operation=exc.operation,
    )


def _finished(exc: verification_service.AlreadyFinished) -> ProblemError:
    status = 410 if exc.state.value == "expired" else 409
    return ProblemError(
        status, "verification-finished", "Verification finished", str(exc), state=exc.state.value
    )


def _http_error(exc: StarletteHTTPException) -> ProblemError:
    slug = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
    return ProblemError(exc.status_code, slug, str(exc.detail), headers=dict(exc.headers or {}))


def _database_down(exc: Exception) -> ProblemError:
    return database_unavailable(type(exc).__name__)


def _driver_error(exc: DBAPIError) -> ProblemError:
    # Not an outage unless the connection went with it: a refused statement is our bug.
    return _database_down(exc) if exc.connection_invalidated else internal_error(exc)


# Every exception a request may raise, and its answer: the entry of the exception's nearest
# class (its MRO, as Starlette looks handlers up) answers it; `Exception` catches the rest.
PROBLEMS: dict[type[Exception], Callable[[Any], ProblemError]] = {
    ProblemError: lambda exc: exc,
    RequestValidationError: _invalid_request,
    InvalidMessage: ProblemType(
        422, "invalid-message", "Invalid message", fields=lambda exc: {"errors": exc.errors}
    ),
    MessageTooLarge: ProblemType(
        413, "message-too-large", "Message too large", fields=lambda exc: {"errors": exc.errors}
    ),
    idempotency.KeyReused: _key_reused,
    NotAllowed: ProblemType(409, "not-allowed", "Not allowed in this state"),
    message_service.MessageNotFound: ProblemType(404, "not-found", "Not found", "no such message"),
    message_service.NotCancellable: ProblemType(
        409, "not-cancellable", "Not cancellable", fields=lambda exc: {"status_now": exc.status}
    ),
    message_service.InvalidCursor: ProblemType(400, "invalid-cursor", "Invalid cursor"),
    tenant_service.UnknownTenant: ProblemType(404, "not-found", "Not found"),
    verification_service.NotFound: ProblemType(
        404, "not-found", "Not found", "no such verification"
    ),
    verification_service.ActiveVerificationExists: ProblemType(
        409,
        "active-verification-exists",
        "Active verification exists",
        fields=lambda exc: {"active_verification_id": str(exc.verification_id)},
    ),
    verification_service.RateLimited: ProblemType(
        429,
        "rate-limited",
        "Too many verification emails",
        fields=lambda exc: {"scope": exc.scope},
        headers=lambda exc: {"Retry-After": str(exc.retry_after)},
    ),
    verification_service.Expired: ProblemType(
        410, "verification-expired", "Verification expired", "request a new verification"
    ),
    verification_service.Locked: ProblemType(
        423,
        "verification-locked",
        "Verification locked",
        "too many wrong tokens; resend to get a new one",
    ),
    verification_service.WrongToken: ProblemType(
        400,
        "invalid-token",
        "Invalid token",
        fields=lambda exc: {"attempts_left": exc.attempts_left},
    ),
    verification_service.AlreadyFinished: _finished,
    StarletteHTTPException: _http_error,
    **dict.fromkeys(DATABASE_DOWN, _database_down),
    DBAPIError: _driver_error,
    Exception: internal_error,
}


def problem_for(exc: Exception) -> ProblemError:
    nearest = next(kind for kind in type(exc).__mro__ if kind in PROBLEMS)
    return PROBLEMS[nearest](exc)


def install_error_handlers(app: FastAPI) -> None:
    async def answer(request: Request, exc: Exception) -> Response:
        return problem_for(exc).response()

    for kind in PROBLEMS:
        app.add_exception_handler(kind, answer)
