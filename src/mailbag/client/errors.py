"""What the client raises. Every error answer of the API is an RFC 9457 problem; each is
raised as the class its `type` (or, failing that, its status) names, so callers catch the
case they handle and let the rest through:

    MailbagError                      anything this client raises
    ├── ConnectionFailed              no answer after the retries (__cause__: the httpx error)
    └── APIError                      an error answer: status, type, title, detail, errors
                                      (a list of FieldError, in one shape whatever the case)
        ├── BadRequest                400 (invalid cursor, token, JSON, Idempotency-Key)
        ├── AuthenticationFailed      401: no API key, or a wrong one
        ├── PermissionDenied          403
        ├── NotFound                  404
        ├── Conflict                  409
        │   ├── IdempotencyKeyReused      the key was used before with another body
        │   ├── NotCancellable            a worker already took the message (status_now)
        │   └── ActiveVerificationExists  resend that one (active_verification_id)
        ├── Gone                      410: the verification expired
        ├── PayloadTooLarge           413: message or body over the server's limits
        ├── ValidationError           422: `errors` names each field
        ├── Locked                    423: too many wrong tokens
        ├── RateLimited               429 (retry_after)
        └── ServerError               5xx
            └── ServiceUnavailable    502, 503, 504 (retry_after)

The retryable ones (ConnectionFailed, RateLimited, ServiceUnavailable) reach the caller only
once the retry policy gave up (client/retry.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

PROBLEM_BASE = "https://mailbag.dev/problems/"


class MailbagError(Exception):
    """Anything this client raises."""


@dataclass(frozen=True)
class FieldError:
    """What is wrong with one part of a request: `field` is its name as the request gives
    it (`to`, `attachments[0].content`, `limit`), `message` the server's words."""

    field: str
    message: str


# Where FastAPI says a schema error was; the field's own name is what callers know.
_LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})


def field_errors(raw: object) -> list[FieldError]:
    """A problem's `errors` in one shape. The API gives a domain error's as an object of
    field to message (an invalid or too-large message), a schema error's as a list of
    {"loc", "msg", "type"} (a missing field, a malformed id); anything else is no errors."""
    if isinstance(raw, Mapping):
        return [FieldError(str(field), str(message)) for field, message in raw.items()]
    if not isinstance(raw, list):
        return []
    found = []
    for item in raw:
        if not isinstance(item, Mapping):
            continue
        loc = list(item.get("loc") or [])
        if len(loc) > 1 and loc[0] in _LOCATIONS:
            loc = loc[1:]
        name = ""
        for part in loc:
            name += f"[{part}]" if isinstance(part, int) else f"{'.' if name else ''}{part}"
        found.append(FieldError(name, str(item.get("msg") or item.get("message") or "")))
    return found


class ConnectionFailed(MailbagError):
    """The server never answered (refused, reset, timed out), on every attempt made."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class APIError(MailbagError):
    """An error answer. `errors` lists what is wrong field by field (`FieldError`s; empty
    when the answer names no field); `problem` is the whole problem+json body as the server
    sent it (extension members, and `errors` in its wire form, too); `request_id` is the
    server's X-Request-ID, the key to its log lines."""

    def __init__(self, response: httpx.Response, problem: dict[str, Any], attempts: int) -> None:
        self.response = response
        self.problem = problem
        self.attempts = attempts
        self.status: int = response.status_code
        self.type: str = str(problem.get("type") or "about:blank")
        self.title: str = str(problem.get("title") or response.reason_phrase)
        detail = problem.get("detail")
        self.detail: str | None = None if detail is None else str(detail)
        self.errors: list[FieldError] = field_errors(problem.get("errors"))
        self.request_id: str | None = response.headers.get("X-Request-ID")
        super().__init__(f"{self.status} {self.title}" + (f": {self.detail}" if detail else ""))

    @property
    def slug(self) -> str:
        """The problem type's last segment, e.g. `idempotency-key-reused`."""
        return self.type.rsplit("/", 1)[-1]


class BadRequest(APIError):
    pass


class AuthenticationFailed(APIError):
    pass


class PermissionDenied(APIError):
    pass


class NotFound(APIError):
    pass


class Conflict(APIError):
    pass


class IdempotencyKeyReused(Conflict):
    pass


class NotCancellable(Conflict):
    @property
    def status_now(self) -> str | None:
        value = self.problem.get("status_now")
        return None if value is None else str(value)


class ActiveVerificationExists(Conflict):
    @property
    def active_verification_id(self) -> str | None:
        value = self.problem.get("active_verification_id")
        return None if value is None else str(value)


class Gone(APIError):
    pass


class PayloadTooLarge(APIError):
    pass


class ValidationError(APIError):
    pass


class Locked(APIError):
    pass


class _WithRetryAfter(APIError):
    @property
    def retry_after(self) -> float | None:
        """Seconds the server asked to wait (Retry-After), if it said."""
        return retry_after(self.response)


class RateLimited(_WithRetryAfter):
    pass


class ServerError(APIError):
    pass


class ServiceUnavailable(ServerError, _WithRetryAfter):
    pass


# A problem's type decides first: it is what the server means; the status is the fallback.
BY_TYPE: dict[str, type[APIError]] = {
    "idempotency-key-reused": IdempotencyKeyReused,
    "not-cancellable": NotCancellable,
    "active-verification-exists": ActiveVerificationExists,
}
BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: AuthenticationFailed,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    422: ValidationError,
    423: Locked,
    429: RateLimited,
    502: ServiceUnavailable,
    503: ServiceUnavailable,
    504: ServiceUnavailable,
}


def error_for(response: httpx.Response, attempts: int = 1) -> APIError:
    """The exception for an error answer. A body that is not a problem (a proxy's HTML
    page, say) still gives the class of its status, titled by the reason phrase."""
    problem: dict[str, Any] = {}
    with contextlib.suppress(ValueError):  # not JSON at all
        parsed = response.json()
        if isinstance(parsed, dict):
            problem = parsed
    kind = BY_TYPE.get(str(problem.get("type", "")).removeprefix(PROBLEM_BASE))
    if kind is None:
        kind = BY_STATUS.get(response.status_code)
    if kind is None:
        kind = ServerError if response.status_code >= 500 else APIError
    return kind(response, problem, attempts)


def retry_after(response: httpx.Response) -> float | None:
    """Seconds the answer's Retry-After asks for: delay-seconds, or an HTTP-date taken
    against the answer's own Date header (so a skewed local clock does not matter) and
    else against the local clock. None when absent or unreadable."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    now = None
    with contextlib.suppress(TypeError, ValueError):
        now = parsedate_to_datetime(response.headers.get("Date", ""))
    if now is None:
        now = datetime.now(UTC)
    if when.tzinfo is None or now.tzinfo is None:
        return None
    return max(0.0, (when - now).total_seconds())


def describe(exc: httpx.TransportError) -> str:
    """A transport error in words, without the request (its headers carry the API key)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
