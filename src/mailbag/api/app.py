"""The FastAPI application: routes, problem+json errors, request ids, body limits."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import structlog
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mailbag import console, log, metrics, metrics_server, templates
from mailbag.api import admin, messages, verifications, webhooks
from mailbag.api.deadline import RETRY_AFTER_SECONDS, DatabaseDeadline, database_unavailable
from mailbag.api.problems import ProblemError, problem_response
from mailbag.clock import Clock, utcnow
from mailbag.domain import storable
from mailbag.domain.message import InvalidMessage
from mailbag.keys import bearer_matches
from mailbag.services import idempotency
from mailbag.services import messages as message_service
from mailbag.services import verification as verification_service
from mailbag.services.container import Services
from mailbag.services.operations import NotAllowed, Operations
from mailbag.settings import Settings
from mailbag.store import migrate
from mailbag.store.database import dialect_of, make_async_engine, within

JSON_BODY_PATHS = ("/v1/messages", "/v1/email-verifications")
DATABASE_DOWN = (OperationalError, PoolTimeout, ConnectionError, OSError, TimeoutError)


def create_app(settings: Settings | None = None, *, clock: Clock = utcnow) -> FastAPI:
    settings = settings or Settings()
    log.configure(settings.log_level)
    metrics.configure(tenant_labels=settings.metrics_tenant_labels)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_async_engine(
            settings.database_url,
            pool_size=settings.api_pool_size,
            timeout=settings.database_timeout_seconds,
            statement_timeout=settings.database_timeout_seconds,
        )
        dialect = dialect_of(settings.database_url)
        catalog = templates.load(settings.templates_dir)
        app.state.services = Services(
            settings=settings,
            engine=engine,
            clock=clock,
            messages=message_service.Messages(engine, dialect, settings),
            verifications=verification_service.Verifications(engine, dialect, settings),
            operations=Operations(engine, dialect, default_attempts=settings.max_attempts),
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
    )
    app.include_router(messages.router)
    app.include_router(verifications.router)
    if settings.admin_password is not None:
        app.include_router(console.router(settings))
    app.include_router(webhooks.router)
    app.include_router(admin.router)
    app.state.sns_certificates = webhooks.SnsCertificates(settings.sns_cert_hosts)
    app.state.confirm_subscription = webhooks.confirm_subscription
    install_error_handlers(app)
    app.add_middleware(DatabaseDeadline, seconds=settings.database_timeout_seconds)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestContext)

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
    async def prometheus_metrics(request: Request) -> Response:
        """Prometheus metrics; the outbox-wide gauges are read from the database now.
        With METRICS_TOKEN set, only for `Authorization: Bearer <METRICS_TOKEN>`."""
        svc: Services = request.app.state.services
        token = settings.metrics_token
        if token is not None and not bearer_matches(request.headers.get("authorization"), token):
            raise ProblemError(
                401,
                "unauthorized",
                "Unauthorized",
                metrics_server.UNAUTHORIZED_DETAIL,
                headers={"WWW-Authenticate": metrics_server.CHALLENGE},
            )
        try:
            # Within half the request's deadline: during an outage, when metrics matter
            # most, the process's own metrics still come out.
            health = await within(
                settings.database_timeout_seconds / 2, svc.operations.health(svc.clock())
            )
        except DATABASE_DOWN:
            health = None
        if health is not None:
            for state, count in health.counts.items():
                metrics.MESSAGES.labels(state).set(count)
            metrics.OLDEST_DUE_AGE.set(health.oldest_due_age_seconds or 0)
            metrics.UNMATCHED_STORED.set(health.unmatched_provider_events)
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

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
            app = problem_response(
                415,
                "unsupported-media-type",
                "Unsupported media type",
                "send the body as application/json",
            )
        try:
            await app(scope, receive, send_with_id)
        except Exception as exc:
            answer = internal_error(exc)
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


def internal_error(exc: BaseException) -> Response:
    """Log an unhandled error (its types and frames, never its message) and answer 500."""
    log.get("mailbag.api").error("unhandled_error", **log.exception_fields(exc))
    return problem_response(
        500,
        "internal-error",
        "Internal server error",
        "the error was logged with this request's id",
    )


class BodyLimit:
    """Refuse bodies over the limit (413), declared or streamed (chunked), before the app
    sees any of it. A declared length is refused unread; any other body is read here, up
    to the limit, and handed on whole. (Stopping the app's own read midway does not work:
    FastAPI turns an error while reading the body into a 400.)"""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        too_large = problem_response(
            413, "body-too-large", "Request body too large", f"the limit is {self.max_bytes} bytes"
        )
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await too_large(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away: nobody to answer
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
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


def install_error_handlers(app: FastAPI) -> None:
    def handle(kind: type[Exception]) -> Callable[[Callable[..., Response]], Any]:
        def register(fn: Callable[..., Response]) -> Any:
            async def handler(request: Request, exc: Any) -> Response:
                return fn(exc)

            app.add_exception_handler(kind, handler)
            return fn

        return register

    @handle(ProblemError)
    def _problem(exc: ProblemError) -> Response:
        return problem_response(
            exc.status, exc.slug, exc.title, exc.detail, headers=exc.headers, **exc.extra
        )

    @handle(RequestValidationError)
    def _invalid(exc: RequestValidationError) -> Response:
        errors = _validation_errors(exc)
        if any(e["type"] == "json_invalid" for e in errors):
            return problem_response(
                400, "invalid-json", "Invalid JSON", "the body is not valid JSON"
            )
        return problem_response(
            422,
            "validation-error",
            "Invalid request",
            "the request does not match the schema",
            errors=errors,
        )

    @handle(InvalidMessage)
    def _invalid_message(exc: InvalidMessage) -> Response:
        return problem_response(
            422, "invalid-message", "Invalid message", str(exc), errors=exc.errors
        )

    @handle(idempotency.KeyReused)
    def _reused(exc: idempotency.KeyReused) -> Response:
        metrics.FINGERPRINT_CONFLICTS.labels(metrics.tenant_label(_tenant())).inc()
        return problem_response(
            409,
            "idempotency-key-reused",
            "Idempotency-Key reused",
            str(exc),
            first_operation=exc.operation,
        )

    @handle(NotAllowed)
    def _not_allowed(exc: NotAllowed) -> Response:
        return problem_response(409, "not-allowed", "Not allowed in this state", str(exc))

    @handle(message_service.MessageNotFound)
    def _message_missing(exc: Exception) -> Response:
        return problem_response(404, "not-found", "Not found", "no such message")

    @handle(message_service.NotCancellable)
    def _not_cancellable(exc: message_service.NotCancellable) -> Response:
        return problem_response(
            409, "not-cancellable", "Not cancellable", str(exc), status_now=exc.status
        )

    @handle(message_service.InvalidCursor)
    def _cursor(exc: Exception) -> Response:
        return problem_response(400, "invalid-cursor", "Invalid cursor", str(exc))

    @handle(verification_service.NotFound)
    def _verification_missing(exc: Exception) -> Response:
        return problem_response(404, "not-found", "Not found", "no such verification")

    @handle(verification_service.ActiveVerificationExists)
    def _active(exc: verification_service.ActiveVerificationExists) -> Response:
        return problem_response(
            409,
            "active-verification-exists",
            "Active verification exists",
            str(exc),
            active_verification_id=str(exc.verification_id),
        )

    @handle(verification_service.RateLimited)
    def _limited(exc: verification_service.RateLimited) -> Response:
        return problem_response(
            429,
            "rate-limited",
            "Too many verification emails",
            str(exc),
            headers={"Retry-After": str(exc.retry_after)},
            scope=exc.scope,
        )

    @handle(verification_service.Expired)
    def _expired(exc: Exception) -> Response:
        return problem_response(
            410, "verification-expired", "Verification expired", "request a new verification"
        )

    @handle(verification_service.Locked)
    def _locked(exc: Exception) -> Response:
        return problem_response(
            423,
            "verification-locked",
            "Verification locked",
            "too many wrong tokens; resend to get a new one",
        )

    @handle(verification_service.WrongToken)
    def _wrong(exc: verification_service.WrongToken) -> Response:
        return problem_response(
            400, "invalid-token", "Invalid token", str(exc), attempts_left=exc.attempts_left
        )

    @handle(verification_service.AlreadyFinished)
    def _finished(exc: verification_service.AlreadyFinished) -> Response:
        status = 410 if exc.state.value == "expired" else 409
        return problem_response(
            status,
            "verification-finished",
            "Verification finished",
            str(exc),
            state=exc.state.value,
        )

    @handle(StarletteHTTPException)
    def _http(exc: StarletteHTTPException) -> Response:
        slug = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        return problem_response(
            exc.status_code, slug, str(exc.detail), headers=dict(exc.headers or {})
        )

    for outage in (*DATABASE_DOWN, DBAPIError):

        @handle(outage)
        def _database_down(exc: Exception) -> Response:
            if (
                isinstance(exc, DBAPIError)
                and not isinstance(exc, OperationalError)
                and not (exc.connection_invalidated)
            ):
                response: Response = _internal(exc)
                return response
            return database_unavailable(type(exc).__name__)

    @handle(Exception)
    def _internal(exc: Exception) -> Response:
        return internal_error(exc)
