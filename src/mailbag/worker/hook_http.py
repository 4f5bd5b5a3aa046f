"""How the hook deliverer reaches a receiver, and what it may say about a failure.

Where a connection may go (domain/hooks/urls.py) is checked again for every connection the
client opens: the host is resolved (the system's resolver, or DNS_NAMESERVERS), every
address it has is checked, and the connection is made to an address that was checked,
never to the name again, so an answer that changes between the check and the connect (DNS
rebinding) cannot pass. This happens in the client's network backend (`GuardedBackend`),
under httpx and httpcore, which keep the URL's host for the Host header and for TLS (SNI
and the name the certificate must carry) exactly as without it; connections are pooled by
that host, as usual. No proxy from the environment: a proxy would make the connect.

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

import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from ipaddress import ip_address
from typing import Any

import httpcore
import httpx

from mailbag.domain.hooks.urls import Policy, UnsafeUrl, address_problem, is_loopback_name
from mailbag.domain.hooks.urls import name_problem as hook_name_problem
from mailbag.resolver import IPAddress, NotResolved, Resolver, SystemResolver

# RFC 6761: localhost names mean this machine; they are never asked of DNS.
LOOPBACK_ADDRESSES = (ip_address("127.0.0.1"), ip_address("::1"))
DRAIN_BYTES = 16 * 1024  # of an answer's body read (and dropped) so the connection is reused


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


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting only to addresses the guard checked: each in
    turn until one answers (a host may have several, IPv6 ones unreachable from here)."""

    def __init__(self, guard: Guard, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self.guard, self.inner = guard, inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        refused: httpcore.ConnectError | None = None
        for address in await self.guard.addresses(host, port):
            try:
                return await self.inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                refused = exc
        assert refused is not None  # addresses() never answers an empty list
        raise refused

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise DestinationRefused(Failure(Reason.FORBIDDEN, "hooks never use a Unix socket"))

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a pool whose network backend is `GuardedBackend` (httpx
    takes no backend of its own, so the pool it built is replaced by an equal one)."""

    def __init__(
        self, guard: Guard, *, verify: ssl.SSLContext | bool, limits: httpx.Limits
    ) -> None:
        super().__init__(verify=verify, limits=limits, trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(guard),
        )


def client(
    guard: Guard,
    *,
    timeout: float,
    connections: int,
    verify: ssl.SSLContext | bool = True,
) -> httpx.AsyncClient:
    """The deliverer's HTTP client: guarded connections, no redirects, no proxies."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(
        transport=GuardedTransport(guard, verify=verify, limits=limits),
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        trust_env=False,
    )


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
        if isinstance(cause, httpx.TimeoutException | TimeoutError):
            return Failure(Reason.TIMEOUT, "no answer in time")
    for cause in _chain(exc):
        if isinstance(cause, httpx.InvalidURL | UnicodeError):
            return Failure(Reason.FORBIDDEN, "the URL cannot be sent to")
        if isinstance(cause, httpx.ConnectError):
            return Failure(Reason.NETWORK, "could not connect")
        if isinstance(cause, httpx.HTTPError | OSError):
            return Failure(Reason.NETWORK, "the HTTP exchange failed")
    return Failure(Reason.INTERNAL, f"mailbag failed ({type(exc).__name__}); see its log")


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in found and len(found) < 10:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found
