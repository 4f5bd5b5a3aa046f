"""Limits on the connections uvicorn serves that uvicorn does not set: how long a request's
header may take, how large it may be, and how many connections one process serves. Their
values come from the API_* settings through runtime.ConnectionLimits, which uvicorn calls
for each connection's protocol (uvicorn's own keep-alive timeout is passed as it is).

- Header deadline: a new connection, and a kept-alive one from its next request's first
  byte on, has API_HEADER_TIMEOUT_SECONDS for the request line and headers (nginx's
  client_header_timeout); past it: 408, and the connection closes. A kept-alive
  connection on which nothing comes is closed by uvicorn's keep-alive timeout.
- Header size: past API_MAX_HEADER_BYTES, 431 and the connection closes. The httptools
  parser has no bound of its own: a client could send headers until memory runs out.
- Connections: a request on a connection beyond API_MAX_CONNECTIONS open ones is answered
  503 with Retry-After (uvicorn's own limit_concurrency answers text/plain without it),
  and its connection closes.

Built on uvicorn's httptools protocol, pinned instead of "auto": mailbag depends on
uvicorn[standard], which always installs httptools, so "auto" picks it anyway; and its
parser calls back where a request begins (on_message_begin) and where its header ends
(on_headers_complete), which is all the header deadline needs. h11's protocol has no such
hooks and would need a subclass of its own.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any, Protocol

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from mailbag.api.intake_limits import SHED_RETRY_AFTER_SECONDS
from mailbag.api.problems import MEDIA_TYPE, ProblemError


class Limits(Protocol):
    """What a connection may take (runtime.ConnectionLimits holds the API_* values)."""

    @property
    def header_timeout_seconds(self) -> float: ...
    @property
    def max_header_bytes(self) -> int: ...
    @property
    def max_connections(self) -> int: ...


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: Limits,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        self.header_timer: asyncio.TimerHandle | None = None  # set while a header is read
        self.header_bytes = 0
        self.served_app = self.app
        self.app = self.app_within_limit  # the app uvicorn runs for each request

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.header_begins()

    def connection_lost(self, exc: Exception | None) -> None:
        self.header_ends()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # calls on_message_begin and on_headers_complete
        if self.header_timer is not None:  # the header is not over: all of it counts
            self.header_bytes += len(data)
            if self.header_bytes > self.limits.max_header_bytes:
                self.refuse(
                    ProblemError(
                        431,
                        "header-too-large",
                        "Request header too large",
                        f"the request line and headers may be {self.limits.max_header_bytes} "
                        "bytes at most",
                    )
                )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.header_timer is None:  # a kept-alive connection's next request
            self.header_begins()

    def on_headers_complete(self) -> None:
        self.header_ends()
        super().on_headers_complete()

    def header_begins(self) -> None:
        self.header_bytes = 0
        self.header_timer = self.loop.call_later(
            self.limits.header_timeout_seconds, self.header_timed_out
        )

    def header_ends(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def header_timed_out(self) -> None:
        self.header_timer = None
        self.refuse(
            ProblemError(
                408,
                "header-too-slow",
                "Request header too slow",
                f"the request line and headers must arrive within "
                f"{self.limits.header_timeout_seconds:g} s",
            )
        )

    def refuse(self, problem: ProblemError) -> None:
        """Answer a request whose header is not whole (no ASGI cycle has begun for it), and
        close the connection."""
        self.header_ends()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request's header, while the one before it is answered: that
            # answer is let finish, read no further, and the connection closes after it.
            self.cycle.keep_alive = False
            self.flow.pause_reading()
            return
        self.transport.write(raw_answer(problem))
        self.transport.close()

    async def app_within_limit(self, scope: Any, receive: Any, send: Any) -> None:
        if len(self.connections) > self.limits.max_connections:  # this one among them
            refused = ProblemError(
                503,
                "too-many-connections",
                "Too many connections",
                f"this server serves at most {self.limits.max_connections} connections at "
                "once; retry shortly",
                headers={"Retry-After": str(SHED_RETRY_AFTER_SECONDS), "Connection": "close"},
            )
            await refused.response()(scope, receive, send)
            return
        await self.served_app(scope, receive, send)


def raw_answer(problem: ProblemError) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, for when no ASGI cycle exists."""
    body = json.dumps(problem.body()).encode()
    head = [
        f"HTTP/1.1 {problem.status} {HTTPStatus(problem.status).phrase}",
        f"content-type: {MEDIA_TYPE}",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name}: {value}" for name, value in problem.headers.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body
