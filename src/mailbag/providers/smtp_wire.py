"""The mail transactions of an SMTP session, pipelined (RFC 2920) when the server offers it.

Why not aiosmtplib for this part: its protocol reads one reply per command it writes
("if multiple commands are written to the transport without awaiting, response data will
be lost"), so it cannot pipeline, and each of its commands costs a task-level round trip
of its own. A mail transaction is a few short lines whose replies come back in order;
reading them in order off a buffer is all PIPELINING needs. Session setup -- connect,
implicit TLS, EHLO, STARTTLS, AUTH -- happens once per connection and stays with
aiosmtplib (see providers.smtp `_open`): once the session is ready, its transport is handed
to a `Wire`, which speaks MAIL FROM / RCPT TO / DATA / content / RSET / QUIT.

Failures are aiosmtplib's exception types, so providers.smtp classifies them exactly as
before: a reply other than the expected one is `SMTPResponseException(code, text)`, a lost
connection `SMTPServerDisconnected` (a ConnectionError), no reply in time
`SMTPReadTimeoutError` (a TimeoutError), a garbled reply an `SMTPResponseException` with
code -1.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

from aiosmtplib import (
    SMTPReadTimeoutError,
    SMTPResponse,
    SMTPResponseException,
    SMTPServerDisconnected,
)

MAX_LINE: Final = 8192  # a reply line longer than this is garbage (aiosmtplib's own limit)
MAX_BUFFERED: Final = 1 << 20
MALFORMED: Final = -1


class Wire(asyncio.Protocol):
    """A transport's replies, parsed as they arrive and handed out in order.

    Replies that arrive with nobody waiting are kept (that is what pipelining needs); the
    caller reads as many as it sent commands. After a failure in mid-conversation (a
    timeout, a lost connection) the session's state is unknown: close it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._replies: deque[SMTPResponse] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._wanted = 0  # how many replies the waiter waits for
        self._error: BaseException | None = None  # the connection is gone, or garbled

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            self._parse()
        except SMTPResponseException as exc:
            self._fail(exc)
            self.close()
            return
        if self._waiter is not None and len(self._replies) >= self._wanted:
            self._wake()

    def eof_received(self) -> bool:
        self._fail(SMTPServerDisconnected("Unexpected EOF received"))
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(SMTPServerDisconnected(f"Connection lost: {exc}" if exc else "Connection lost"))
        self.transport = None

    # --- use -------------------------------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        return (
            self._error is None and self.transport is not None and not self.transport.is_closing()
        )

    @property
    def has_unread(self) -> bool:
        """A reply came that no command asked for (an idle server's 421 before it hangs
        up): the next command would take it for its own."""
        return bool(self._replies)

    def write(self, data: bytes) -> None:
        """Hand bytes to the transport; raises (having sent nothing) if the connection is
        already known to be gone."""
        if not self.is_connected:
            raise self._error or SMTPServerDisconnected("Connection lost")
        assert self.transport is not None
        self.transport.write(data)

    async def replies(self, count: int, wait: float) -> list[SMTPResponse]:
        """The next COUNT replies, in order. Raises if the connection ends (or a reply is
        garbled) before they are all in, or if they are not all in within WAIT seconds."""
        if len(self._replies) < count:
            if self._error is not None:
                raise self._error
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            self._wanted = count
            timer = loop.call_later(wait, self._time_out, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return [self._replies.popleft() for _ in range(count)]

    async def reply(self, wait: float) -> SMTPResponse:
        return (await self.replies(1, wait))[0]

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # --- inside ----------------------------------------------------------------------------

    def _parse(self) -> None:
        """Move every complete reply from the buffer to the queue."""
        buffer = self._buffer
        start = 0
        lines: list[bytes] = []
        while True:
            end = buffer.find(b"\n", start)
            if end == -1:
                if len(buffer) - start > MAX_LINE:
                    raise SMTPResponseException(MALFORMED, "Response too long")
                break
            line = bytes(buffer[start : end + 1])
            start = end + 1
            if len(line) > MAX_LINE:
                raise SMTPResponseException(MALFORMED, "Response too long")
            code = line[:3]
            if not code.isdigit():
                text = line.decode("utf-8", "replace").strip()
                raise SMTPResponseException(MALFORMED, f"Malformed SMTP response line: {text}")
            lines.append(line[4:].strip(b" \t\r\n"))
            if line[3:4] != b"-":  # the last line of a reply
                text = b"\n".join(lines).decode("utf-8", "surrogateescape")
                self._replies.append(SMTPResponse(int(code), text))
                lines = []
                del buffer[:start]
                start = 0
        if len(buffer) > MAX_BUFFERED:
            raise SMTPResponseException(MALFORMED, "Response too long")

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(self._error)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @staticmethod
    def _time_out(waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(SMTPReadTimeoutError("Timed out waiting for server response"))
