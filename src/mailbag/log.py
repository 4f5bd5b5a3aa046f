"""Structured JSON logs (structlog), one line per event, never carrying secrets.

Callers bind context (worker_id, message_id, attempt, request_id, tenant) and log events;
`redact` drops any key that looks like a secret before a line is written, as a second line
of defence behind "don't log it in the first place".
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import MutableMapping
from typing import Any

import structlog

_level = logging.INFO
SECRET_KEYS = ("password", "token", "api_key", "apikey", "secret", "authorization", "key")
_configured = False


def redact(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for name in list(event):
        lowered = name.lower()
        if any(secret in lowered for secret in SECRET_KEYS) and not lowered.endswith("_hash"):
            event[name] = "[redacted]"
    return event


def configure(level: str = "INFO", *, json: bool = True) -> None:
    global _configured, _level
    if _configured:
        return
    _configured = True
    _level = logging.getLevelName(level)
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # one line per migration is noise
    # httpx logs every request's URL at INFO, as plain text: a hook receiver's URL may carry
    # its own token in the query, and mailbag logs what it did itself, as JSON.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=lambda *_: _StderrLogger(),
        cache_logger_on_first_use=False,
    )


def enabled(level: int) -> bool:
    """Whether lines at this level are written: hot paths skip building ones that are not."""
    return level >= _level


class _StderrLogger:
    """Writes each line to whatever sys.stderr is at that moment (tests swap it)."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def exception_fields(exc: BaseException) -> dict[str, Any]:
    """What a log line may say about an error whose message may quote a request: a
    database error repeats the statement's parameters (recipient, Idempotency-Key, data)
    and PostgreSQL quotes the JSON it refused. So: the type, the driver's error code, and
    each exception of the chain with the frames it passed through, never a message."""
    fields: dict[str, Any] = {"error": type(exc).__name__}
    orig = getattr(exc, "orig", None)  # a SQLAlchemy DBAPIError's driver exception
    args = getattr(orig, "args", ())
    errno = args[0] if args and isinstance(args[0], int) else None  # MySQL's; never a message
    code = getattr(orig, "sqlstate", None) or getattr(orig, "sqlite_errorname", None) or errno
    if code is not None:
        fields["error_code"] = code
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    fields["stack"] = "".join(
        f"{type(e).__module__}.{type(e).__qualname__}\n"
        + "".join(traceback.format_tb(e.__traceback__))
        for e in reversed(chain)
    )
    return fields


def get(name: str | None = None, **context: Any) -> Any:
    return structlog.get_logger(name).bind(**context)
