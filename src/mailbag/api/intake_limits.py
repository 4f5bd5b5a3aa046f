"""What a request body may cost before the app sees it: its size, its key, its share of the
process's memory and its pace.

BodyLimit, an ASGI middleware outside everything that reads a body, reads each body whole
and hands it on. On the way:

- Size: a body over its route's limit is a 413; a declared one is refused unread.
- Key first: a route with a larger limit (a message and its attachments, ~21.6 MiB) reads no
  more than MAX_BODY_BYTES of its body before the request shows a valid tenant key (the
  routes' own check, deps.tenant_behind): a 401 otherwise, so a client without a key cannot
  make the process hold a large body.
- In flight: the bodies one process holds at once are bounded (InFlight). A declared length
  is counted before its first byte is read, a chunked body as it arrives, and both are given
  back when the request ends, however it ends (answered, failed, cancelled, the client
  gone). A body that would go past the bound is a 503 with Retry-After.
- Pace: a body may pause at most API_BODY_TIMEOUT_SECONDS between two reads (nginx's
  client_body_timeout) and must arrive whole within API_BODY_TIMEOUT_SECONDS plus its size
  at API_BODY_MIN_BYTES_PER_SECOND (Apache mod_reqtimeout's MinRate), so a body trickled a
  byte at a time is dropped however steadily it comes: a 408.

A refusal before the body was read whole says `Connection: close`: uvicorn then closes the
connection instead of reading the rest of the body to reuse it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mailbag import web
from mailbag.api import deps
from mailbag.api.problems import ProblemError
from mailbag.console.render import refused as console_refusal
from mailbag.settings import Settings
from mailbag.store.database import within

# Bodies in flight clear as their requests finish, in about a second even for large ones.
SHED_RETRY_AFTER_SECONDS = 2


@dataclass
class InFlight:
    """The request-body bytes this process holds, against its bound. One event loop serves
    every request of a process, so taking and giving back need no lock."""

    limit: int
    held: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> InFlight:
        # Unset: three bodies at the message limit (~65 MiB by default). A message costs a
        # few times its body while it is decoded and stored (four with 10 MiB attachments,
        # 13.4 MiB of JSON each, took a process up by 233 MB: docs/benchmarks.md), so this
        # keeps it within a few hundred MB; requests of a few KiB hardly use it.
        return cls(settings.api_body_bytes_in_flight or 3 * settings.message_body_bytes)

    def take(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give_back(self, n: int) -> None:
        self.held -= n


@dataclass(frozen=True)
class Pace:
    """How fast a body must come (see the module's docstring)."""

    timeout_seconds: float
    min_bytes_per_second: float

    @classmethod
    def from_settings(cls, settings: Settings) -> Pace:
        return cls(settings.api_body_timeout_seconds, settings.api_body_min_bytes_per_second)

    def wait(self, started: float, received: int, now: float) -> float:
        """How long the next read may take: until the body's deadline, and no longer than
        the idle timeout."""
        deadline = started + self.timeout_seconds + received / self.min_bytes_per_second
        return min(self.timeout_seconds, deadline - now)


def _console(scope: Scope) -> bool:
    path: str = scope["path"]
    return path == "/admin" or path.startswith("/admin/")


class Refused(Exception):
    """A request answered before its body was read whole."""

    def __init__(self, problem: ProblemError) -> None:
        super().__init__(problem.title)
        self.problem = problem


class ClientGone(Exception):
    """The client disconnected while its body was read: nobody to answer."""


class BodyLimit:
    """Bodies read whole before the app sees them, within their limits (the module's
    docstring). `larger` gives some (method, path)s a limit of their own, above `max_bytes`:
    those want a key before more than `max_bytes` is read. `problems` answers an exception
    raised while the key is checked (the database down is a 503, not a 500)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        larger: dict[tuple[str, str], int],
        in_flight: InFlight,
        pace: Pace,
        problems: Callable[[Exception], ProblemError],
    ) -> None:
        self.app, self.max_bytes, self.larger = app, max_bytes, larger
        self.in_flight, self.pace, self.problems = in_flight, pace, problems

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held = 0

        def take(n: int) -> None:
            nonlocal held
            if not self.in_flight.take(n):
                raise Refused(busy(self.in_flight.limit))
            held += n

        try:
            try:
                body = await self._read(scope, receive, take)
            except Refused as refused:
                problem = refused.problem
                problem.headers = {**problem.headers, "Connection": "close"}
                answer: Response = problem.response()
                if _console(scope):  # an operator's form: a page, not JSON
                    answer = console_refusal(problem.status, problem.title, problem.detail or "")
                    answer.headers.update(problem.headers)
                await answer(scope, receive, send)
                return
            except ClientGone:
                return
            whole: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

            async def replay() -> Message:
                return whole.pop() if whole else await receive()

            await self.app(scope, replay, send)
        finally:  # the app has let go of the body (or never had it)
            self.in_flight.give_back(held)

    async def _read(self, scope: Scope, receive: Receive, take: Callable[[int], None]) -> bytes:
        route = self.larger.get((scope["method"], scope["path"].rstrip("/")), self.max_bytes)
        limit = min(route, self.in_flight.limit)  # a larger body could never be taken in
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            raise Refused(too_large(limit))
        keyed = limit <= self.max_bytes  # only a larger limit wants the key first
        if not keyed and declared is not None and declared > self.max_bytes:
            await self._require_key(scope)
            keyed = True
        if declared is not None:
            take(declared)
        loop = asyncio.get_running_loop()
        started = loop.time()
        body = bytearray()
        while True:
            wait = self.pace.wait(started, len(body), loop.time())
            try:
                if wait <= 0:
                    raise TimeoutError
                async with asyncio.timeout(wait):
                    message = await receive()
            except TimeoutError:
                raise Refused(too_slow(self.pace)) from None
            if message["type"] != "http.request":
                raise ClientGone
            chunk = message.get("body", b"")
            body += chunk
            if len(body) > limit:
                raise Refused(too_large(limit))
            if not keyed and len(body) > self.max_bytes:  # a chunked body past the common limit
                await self._require_key(scope)
                keyed = True
            if declared is None:
                take(len(chunk))
            if not message.get("more_body", False):
                return bytes(body)

    async def _require_key(self, scope: Scope) -> None:
        request = Request(scope)
        svc = web.services(request)
        try:
            credentials = await deps.bearer(request)
            await within(
                svc.settings.database_timeout_seconds, deps.tenant_behind(svc, credentials)
            )
        except Exception as exc:
            raise Refused(self.problems(exc)) from None


def _declared_length(scope: Scope) -> int | None:
    # The HTTP parser has refused a malformed Content-Length before the app is called.
    declared = Headers(scope=scope).get("content-length")
    return int(declared) if declared is not None and declared.isdigit() else None


def too_large(limit: int) -> ProblemError:
    return ProblemError(
        413, "body-too-large", "Request body too large", f"the limit is {limit} bytes"
    )


def busy(limit: int) -> ProblemError:
    return ProblemError(
        503,
        "bodies-in-flight",
        "Too many request bodies in flight",
        f"this server holds at most {limit} bytes of request bodies at once; retry shortly",
        headers={"Retry-After": str(SHED_RETRY_AFTER_SECONDS)},
    )


def too_slow(pace: Pace) -> ProblemError:
    return ProblemError(
        408,
        "body-too-slow",
        "Request body too slow",
        f"a body may pause at most {pace.timeout_seconds:g} s and must come at "
        f"{pace.min_bytes_per_second:g} bytes a second or faster",
    )
