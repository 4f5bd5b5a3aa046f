"""RFC 9457 problem details: every error the API returns, with a stable `type` each, and
the one table (`PROBLEMS`) that says which exception is answered how, for every router.

An exception is answered by the entry of its nearest class (its MRO, as Starlette looks
handlers up); `Exception` catches the rest, as a 500 that is logged without its message.
A route raises its service's own exceptions (UnknownTenant, HooksOff, InvalidMessage ...)
or a ProblemError; it never builds an error answer itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from mailbag import log, metrics
from mailbag.domain.hooks import InvalidHook
from mailbag.domain.message import InvalidMessage, MessageTooLarge
from mailbag.domain.templates import InvalidTemplate, TemplateTooLarge
from mailbag.services import erasure as erasure_service
from mailbag.services import hooks as hook_service
from mailbag.services import idempotency, maintenance
from mailbag.services import messages as message_service
from mailbag.services import pauses as pause_service
from mailbag.services import sender_domains as domain_service
from mailbag.services import templates as template_service
from mailbag.services import tenant_accounts as account_service
from mailbag.services import tenants as tenant_service
from mailbag.services import verification as verification_service
from mailbag.services.operations import NotAllowed
from mailbag.templates import TemplateError

PROBLEM_BASE = "https://mailbag.dev/problems/"
DATABASE_DOWN = (OperationalError, PoolTimeout, ConnectionError, OSError, TimeoutError)
MEDIA_TYPE = "application/problem+json"


class Problem(BaseModel):
    """The body of every error response."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None


class ProblemError(Exception):
    """A problem: raise it anywhere in a request, or answer with its `response()`."""

    def __init__(
        self,
        status: int,
        slug: str,
        title: str,
        detail: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail or title)
        self.status, self.slug, self.title, self.detail = status, slug, title, detail
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """The problem as JSON: a response's body, or an invalid batch item's `error`."""
        body: dict[str, Any] = {
            "type": PROBLEM_BASE + self.slug,
            "title": self.title,
            "status": self.status,
        }
        if self.detail is not None:
            body["detail"] = self.detail
        body.update(self.extra)
        return body

    def response(self) -> JSONResponse:
        return JSONResponse(
            self.body(), status_code=self.status, media_type=MEDIA_TYPE, headers=self.headers
        )


def not_found(detail: str) -> ProblemError:
    return ProblemError(404, "not-found", "Not found", detail)


def unauthorized(detail: str, challenge: str) -> ProblemError:
    """401 with the WWW-Authenticate challenge that says which credentials to send."""
    return ProblemError(
        401, "unauthorized", "Unauthorized", detail, headers={"WWW-Authenticate": challenge}
    )


def too_many_attempts(retry_after: int) -> ProblemError:
    return ProblemError(
        429,
        "too-many-attempts",
        "Too many failed attempts",
        f"too many wrong credentials; try again in {retry_after} s",
        headers={"Retry-After": str(retry_after)},
    )


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer with."""
    return {
        status: {"model": Problem, "content": {MEDIA_TYPE: {}}, "description": "A problem."}
        for status in statuses
    }


# Statuses any authenticated route may answer with.
COMMON = (400, 401, 413, 415, 422, 500, 503)


RETRY_AFTER_SECONDS = 5


def database_unavailable(error: str) -> ProblemError:
    """The one answer for a database that is down or too slow, logged."""
    log.get("mailbag.api").warning("database_unavailable", error=error)
    return ProblemError(
        503,
        "database-unavailable",
        "Service unavailable",
        "the database is unreachable; retry shortly",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


def internal_error(exc: BaseException) -> ProblemError:
    """Log an unhandled error (its types and frames, never its message): a 500."""
    log.get("mailbag.api").error("unhandled_error", **log.exception_fields(exc))
    return ProblemError(
        500,
        "internal-error",
        "Internal server error",
        "the error was logged with this request's id",
    )


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


def _template_problems(exc: TemplateError) -> ProblemError:
    """A template that does not compile or render (with its sample data, or a message's
    data): each problem's part, line and message."""
    found = getattr(exc, "problems", None)
    problems = (
        [{"part": p.part, "line": p.line, "message": p.message} for p in found]
        if found
        else [{"part": None, "line": None, "message": str(exc)}]
    )
    return ProblemError(
        422, "template-problems", "Template does not render", str(exc), problems=problems
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
    # Event hooks (api/hooks.py)
    hook_service.HooksOff: ProblemType(404, "hooks-off", "Event hooks are off"),
    InvalidHook: ProblemType(
        422, "invalid-hook", "Invalid hook endpoint", fields=lambda exc: {"errors": exc.errors}
    ),
    hook_service.UnknownEndpoint: ProblemType(404, "not-found", "Not found"),
    hook_service.UnknownDelivery: ProblemType(404, "not-found", "Not found"),
    hook_service.NotReplayable: ProblemType(409, "not-replayable", "Not replayable now"),
    # Tenants' own provider accounts (api/admin.py)
    account_service.NoAccountKey: ProblemType(409, "no-secret-key", "No key to seal accounts"),
    account_service.InvalidAccount: ProblemType(422, "invalid-account", "Invalid account"),
    account_service.NoAccount: ProblemType(404, "not-found", "Not found"),
    account_service.UnreadableAccount: ProblemType(409, "account-unreadable", "Account unreadable"),
    # Sender domains (api/admin.py)
    domain_service.NoDomainKey: ProblemType(409, "no-secret-key", "No key to seal DKIM keys"),
    domain_service.InvalidDomain: ProblemType(422, "invalid-domain", "Invalid sender domain"),
    domain_service.DomainExists: ProblemType(409, "domain-exists", "Sender domain exists"),
    domain_service.UnknownDomain: ProblemType(404, "not-found", "Not found"),
    domain_service.RotationRefused: ProblemType(409, "rotation-refused", "Rotation refused"),
    # Operators' pauses (api/admin.py)
    pause_service.InvalidPause: ProblemType(
        422, "invalid-pause", "Invalid pause", fields=lambda exc: {"errors": exc.errors}
    ),
    pause_service.NotPaused: ProblemType(404, "not-found", "Not found"),
    # Erasures and retention (api/admin.py)
    erasure_service.InvalidAddress: ProblemType(422, "invalid-address", "Invalid address"),
    erasure_service.NoErasureKey: ProblemType(409, "no-secret-key", "No key to hash addresses"),
    maintenance.InvalidRetention: ProblemType(422, "invalid-retention", "Invalid retention"),
    # Tenants' templates (api/templates.py)
    InvalidTemplate: ProblemType(
        422, "invalid-template", "Invalid template", fields=lambda exc: {"errors": exc.errors}
    ),
    TemplateTooLarge: ProblemType(
        413, "template-too-large", "Template too large", fields=lambda exc: {"errors": exc.errors}
    ),
    TemplateError: _template_problems,
    template_service.UnknownTemplate: ProblemType(404, "not-found", "Not found"),
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
