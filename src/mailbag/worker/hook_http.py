"""How the hook deliverer reaches a receiver, and what it may say about a failure.

Where a connection may go (domain/hooks/urls.py) is checked again for every connection the
client opens: the host is resolved (the system's resolver, or DNS_NAMESERVERS), every
address it has is checked, and the connection is made to an address that was checked,
never to the name again, so an answer that changes between the check and the connect (DNS
rebinding) cannot pass. The URL's host is still the one in the Host header and in TLS (SNI
and the name the certificate must carry); connections are kept and reused per origin
(scheme, host, port). No proxy from the environment: a proxy would make the connect.

The client (`HookClient`) speaks HTTP/1.1 with h11, the protocol machine under httpx, on
asyncio's own transports: httpx's layers cost more CPU per POST than all the rest of a
delivery (claim, signature, bookkeeping) together.

What a failed attempt records (`Failure`): a reason from a fixed vocabulary and a short
text of mailbag's own, never a byte of the receiver's answer, which could be an internal
service's (the answer's body is never read beyond draining a small one for reuse).

    Failure.reason   what happened
    timeout          no full answer within HOOK_TIMEOUT_SECONDS
    refused          the receiver's host refused the connection
    tls              the TLS handshake failed (certificate, protocol)
    dns              the name does not resolve
    forbidden        the URL, or an address its name resolves to, is one hooks must not reach
    network          any other failure to connect or to exchange HTTP
    redirect         a 3xx answer (never followed)
    http-4xx         a 4xx answer (the status code is kept beside it)
    http-5xx         a 5xx answer
    internal         a bug of mailbag's (the exception's type is logged)
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from ipaddress import ip_address
from typing import Protocol

import h11
import httpx

from mailbag.domain.hooks.urls import (
    Destination,
    Policy,
    UnsafeUrl,
    address_problem,
    is_loopback_name,
)
from mailbag.domain.hooks.urls import name_problem as hook_name_problem
from mailbag.resolver import IPAddress, NotResolved, Resolver, SystemResolver

# RFC 6761: localhost names mean this machine; they are never asked of DNS.
LOOPBACK_ADDRESSES = (ip_address("127.0.0.1"), ip_address("::1"))
DRAIN_BYTES = 16 * 1024  # of an answer's body read (and dropped) so the connection is reused
# Of an answer read at most (head and body) before reading stops: more is never needed.
READ_BYTES = DRAIN_BYTES + 64 * 1024
KEEPALIVE_SECONDS = 5.0  # an idle connection is closed after this long (httpx's default)


class Reason(StrEnum):
    TIMEOUT = "timeout"
    REFUSED = "refused"
    TLS = "tls"
    DNS = "dns"
    FORBIDDEN = "forbidden"
    NETWORK = "network"
    REDIRECT = "redirect"
    HTTP_4XX = "http-4xx"
    HTTP_5XX = "http-5xx"
    INTERNAL = "internal"


@dataclass(frozen=True)
class Failure:
    reason: Reason
    detail: str  # mailbag's own words: safe to log, store and show

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.detail}"


class DestinationRefused(Exception):
    """The connection was not made: where it would go is not allowed, or unknown."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(str(failure))
        self.failure = failure


def answered(status_code: int) -> Failure | None:
    """What a non-2xx answer was (None for a 2xx)."""
    if 200 <= status_code < 300:
        return None
    if 300 <= status_code < 400:
        return Failure(Reason.REDIRECT, f"HTTP {status_code} (redirects are not followed)")
    if status_code >= 500:
        return Failure(Reason.HTTP_5XX, f"HTTP {status_code}")
    return Failure(Reason.HTTP_4XX if status_code >= 400 else Reason.NETWORK, f"HTTP {status_code}")


class Guard:
    """Every address a host may be reached at, once each is checked against `policy`."""

    def __init__(self, policy: Policy, resolver: Resolver | None = None) -> None:
        self.policy, self.resolver = policy, resolver or SystemResolver()

    async def addresses(self, host: str, port: int) -> list[IPAddress]:
        name = host.lower().rstrip(".")
        try:
            candidates: list[IPAddress] = [ip_address(name)]
            where = "the URL names"
        except ValueError:
            if problem := hook_name_problem(name, self.policy):
                raise DestinationRefused(Failure(Reason.FORBIDDEN, f"the URL {problem}")) from None
            where = f"{name} resolves to"
            if is_loopback_name(name):
                candidates = list(LOOPBACK_ADDRESSES)
            else:
                try:
                    candidates = await self.resolver.addresses(name, port)
                except NotResolved as exc:
                    raise DestinationRefused(Failure(Reason.DNS, str(exc))) from None
        for address in candidates:
            if problem := address_problem(address, self.policy):
                raise DestinationRefused(Failure(Reason.FORBIDDEN, f"{where} {problem}"))
        return candidates


Origin = tuple[str, str, int]  # scheme, host, port: what a kept connection may serve again


class ConnectFailed(Exception):
    """No address of the receiver's host took the connection (the last one's error is the
    cause)."""


class ExchangeFailed(Exception):
    """The connection was made, but the HTTP exchange broke off before a full answer."""


class Poster(Protocol):
    """What the deliverer POSTs through (HookClient; a test's stand-in)."""

    async def post(self, to: Destination, body: bytes, headers: Mapping[str, str]) -> int: ...

    async def aclose(self) -> None: ...


class HookClient:
    """POSTs to receivers over HTTP/1.1, keep-alive: h11 (httpx's own HTTP/1.1 machine)
    on asyncio's transports, each connection made by `Guard` only.

    Each POST is a `Destination` (the URL as the rule parsed and checked it), a body and
    headers; its answer is the status code. A connection is kept for the next POST to
    the same origin when the answer was read to its end within DRAIN_BYTES, and closed
    otherwise, or once idle for `keepalive` seconds, or when the receiver says anything
    while it is idle. At most `connections` are kept idle; the deliverer's own bound on
    POSTs in flight bounds the busy ones. No proxy, no redirect (a 3xx is an answer like
    any other), no cookies, no HTTP/2: what httpx did for us here, without its cost per
    request (httpx took 600 us of CPU a POST on loopback, the whole deliverer's budget).
    """

    def __init__(
        self,
        guard: Guard,
        *,
        connections: int,
        verify: ssl.SSLContext | bool = True,
        keepalive: float = KEEPALIVE_SECONDS,
    ) -> None:
        self.guard, self.keep_at_most, self.keepalive = guard, connections, keepalive
        self.tls = httpx.create_ssl_context(verify=verify, trust_env=False)
        self.tls.set_alpn_protocols(["http/1.1"])
        self.idle: dict[Origin, list[_Connection]] = {}

    async def post(self, to: Destination, body: bytes, headers: Mapping[str, str]) -> int:
        """The receiver's status code; ConnectFailed, ExchangeFailed, DestinationRefused,
        an ssl.SSLError or an OSError otherwise. Bound it with a timeout: nothing here
        waits on its own clock."""
        url = to.url
        origin = (url.scheme, to.host, url.port or (443 if url.scheme == "https" else 80))
        request = _request(url, body, headers)
        connection = self._kept(origin) or await self._connect(origin, url)
        try:
            status, reusable = await connection.exchange(request)
        except BaseException:  # a cancel (timeout) included: the connection is spent
            connection.close()
            raise
        if reusable and sum(map(len, self.idle.values())) < self.keep_at_most:
            connection.idle_since = time.monotonic()
            self.idle.setdefault(origin, []).append(connection)
        else:
            connection.close()
        return status

    async def aclose(self) -> None:
        for kept in self.idle.values():
            for connection in kept:
                connection.close()
        self.idle.clear()

    def _kept(self, origin: Origin) -> _Connection | None:
        kept = self.idle.get(origin)
        now = time.monotonic()
        while kept:
            connection = kept.pop()  # the most recent: the others may expire
            if not connection.broken and now - connection.idle_since < self.keepalive:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin, url: httpx.URL) -> _Connection:
        """A connection to the first checked address of the host that takes it; TLS names
        the URL's host (SNI, and the name the certificate must carry)."""
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        failed: OSError | None = None
        for address in await self.guard.addresses(host, port):
            try:
                _, connection = await loop.create_connection(
                    _Connection,
                    str(address),
                    port,
                    ssl=self.tls if scheme == "https" else None,
                    server_hostname=url.raw_host.decode("ascii") if scheme == "https" else None,
                )
                return connection
            except ssl.SSLError:  # the receiver answered: its certificate is the failure
                raise
            except OSError as exc:
                failed = exc
        raise ConnectFailed("could not connect") from failed


# What a POST fails with, short of a timeout: each has its meaning in `failure_of`.
POST_ERRORS = (ConnectFailed, ExchangeFailed, DestinationRefused, h11.ProtocolError, OSError)


def _request(url: httpx.URL, body: bytes, headers: Mapping[str, str]) -> list[h11.Event]:
    head = [("host", url.netloc.decode("ascii")), *headers.items()]
    head.append(("content-length", str(len(body))))
    return [
        h11.Request(method="POST", target=url.raw_path, headers=head),
        h11.Data(data=body),
        h11.EndOfMessage(),
    ]


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: one exchange at a time, read into h11 as bytes arrive."""

    def __init__(self) -> None:
        self.http = h11.Connection(h11.CLIENT)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.busy = self.broken = self.ended = False
        self.received = 0  # bytes of this exchange's answer
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # a byte nobody asked for: this connection is not to be trusted
            self.close()
            return
        self.received += len(data)
        self.http.receive_data(data)
        if self.received > READ_BYTES and self.transport is not None:
            self.transport.pause_reading()  # what is left unread ends with the connection
        self._wake()

    def eof_received(self) -> None:
        self._ended()

    def connection_lost(self, exc: Exception | None) -> None:
        self.broken = True
        self._ended()

    def _ended(self) -> None:
        self.broken = True
        if not self.ended:
            self.ended = True
            if self.busy:
                self.http.receive_data(b"")
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def close(self) -> None:
        self.broken = True
        if self.transport is not None:
            self.transport.close()

    async def exchange(self, request: list[h11.Event]) -> tuple[int, bool]:
        """Send a request, read its answer (the body up to DRAIN_BYTES, then no more): the
        status code, and whether the connection can carry another exchange."""
        assert self.transport is not None
        self.busy, self.received = True, 0
        self.transport.write(b"".join(self.http.send(event) or b"" for event in request))
        while not isinstance(event := await self._next(), h11.Response):
            if isinstance(event, h11.ConnectionClosed):
                raise ExchangeFailed("the receiver closed the connection without an answer")
            # A 1xx answer: the real one follows.
        status = event.status_code
        length = dict(event.headers).get(b"content-length", b"")
        if length.isdigit() and int(length) > DRAIN_BYTES:
            return status, False
        drained = 0
        while True:
            event = await self._next()
            if isinstance(event, h11.Data):
                drained += len(event.data)
                if drained > DRAIN_BYTES:
                    return status, False
            elif isinstance(event, h11.EndOfMessage):
                self.busy = False
                states = (self.http.our_state, self.http.their_state)
                reusable = not self.broken and states == (h11.DONE, h11.DONE)  # keep-alive
                if reusable:
                    self.http.start_next_cycle()
                return status, reusable
            else:  # ConnectionClosed: an answer whose end is the connection's
                return status, False

    async def _next(self) -> h11.Event:
        while (event := self.http.next_event()) is h11.NEED_DATA:
            if self.ended:  # never so: h11 has the end, and says so itself
                raise ExchangeFailed("the receiver closed the connection mid-answer")
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        assert isinstance(event, h11.Event)  # PAUSED comes only after an answer's end
        return event


def failure_of(exc: BaseException) -> Failure:
    """What an exception raised by a POST means, from the first cause in its chain that
    this table knows; texts are mailbag's own, never the exception's (an HTTP parser's
    message can quote the receiver's bytes)."""
    for cause in _chain(exc):
        if isinstance(cause, DestinationRefused):
            return cause.failure
        if isinstance(cause, UnsafeUrl):
            return Failure(Reason.FORBIDDEN, f"the URL {cause}")
        if isinstance(cause, ssl.SSLCertVerificationError):
            why = getattr(cause, "verify_message", None) or "not trusted"
            return Failure(Reason.TLS, f"certificate not accepted: {why}")
        if isinstance(cause, ssl.SSLError):  # OpenSSL's reason code, never the peer's bytes
            why = getattr(cause, "reason", None) or type(cause).__name__
            return Failure(Reason.TLS, f"TLS failed: {why}")
        if isinstance(cause, ConnectionRefusedError):
            return Failure(Reason.REFUSED, "connection refused")
        if isinstance(cause, TimeoutError):
            return Failure(Reason.TIMEOUT, "no answer in time")
    for cause in _chain(exc):
        if isinstance(cause, httpx.InvalidURL | UnicodeError):
            return Failure(Reason.FORBIDDEN, "the URL cannot be sent to")
        if isinstance(cause, ConnectFailed):
            return Failure(Reason.NETWORK, "could not connect")
        if isinstance(cause, ExchangeFailed | h11.ProtocolError | OSError):
            return Failure(Reason.NETWORK, "the HTTP exchange failed")
    return Failure(Reason.INTERNAL, f"mailbag failed ({type(exc).__name__}); see its log")


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in found and len(found) < 10:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found
