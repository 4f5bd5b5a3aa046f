"""Name lookups mailbag makes itself: the system's resolver (getaddrinfo: /etc/hosts, the
configured DNS), or the servers DNS_NAMESERVERS names, asked with dnspython.

DNS_NAMESERVERS is a comma list of `host[:port]` (`10.0.0.2`, `127.0.0.1:5353`,
`[::1]:53`); `nameservers` parses it (settings refuse a bad one at start). Both resolvers
answer every address a name has, IPv4 and IPv6, in the order given, without duplicates;
a name with none raises `NotResolved`.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import Protocol

IPAddress = IPv4Address | IPv6Address
DNS_PORT = 53


class NotResolved(OSError):
    """A name that has no address (or whose lookup failed); the message says which."""


@dataclass(frozen=True)
class Nameserver:
    address: IPAddress
    port: int = DNS_PORT


def nameservers(text: str) -> list[Nameserver]:
    """DNS_NAMESERVERS parsed; ValueError naming the entry that is not `host[:port]` with
    an IP address for the host."""
    found: list[Nameserver] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        host, port = entry, DNS_PORT
        if entry.startswith("["):
            host, _, rest = entry[1:].partition("]")
            if rest:
                if not rest.startswith(":"):
                    raise ValueError(f"DNS_NAMESERVERS: {entry!r} is not host[:port]")
                port = _port(entry, rest[1:])
        elif entry.count(":") == 1:
            host, _, number = entry.partition(":")
            port = _port(entry, number)
        try:
            found.append(Nameserver(ip_address(host), port))
        except ValueError:
            raise ValueError(
                f"DNS_NAMESERVERS: {entry!r} must name a server by its IP address"
            ) from None
    return found


def _port(entry: str, number: str) -> int:
    if not number.isdigit() or not 1 <= int(number) <= 65535:
        raise ValueError(f"DNS_NAMESERVERS: {entry!r} has no valid port")
    return int(number)


class Resolver(Protocol):
    async def addresses(self, host: str, port: int) -> list[IPAddress]: ...


class SystemResolver:
    """getaddrinfo, in threads of its own: a name whose lookup hangs (a receiver's DNS is
    its owner's to make slow) holds one of these, never the event loop's default executor,
    which the SMTP provider's own lookups use."""

    def __init__(self, threads: int = 8) -> None:
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="mailbag-resolver")

    async def addresses(self, host: str, port: int) -> list[IPAddress]:
        lookup = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        try:
            infos = await asyncio.get_running_loop().run_in_executor(self.pool, lookup)
        except (socket.gaierror, UnicodeError) as exc:
            raise NotResolved(f"{host} does not resolve") from exc
        return _unique(ip_address(str(info[4][0]).partition("%")[0]) for info in infos)


class DnsResolver:
    """A and AAAA asked of the given servers, together (dnspython's async resolver)."""

    def __init__(self, servers: Sequence[Nameserver], *, timeout: float = 5.0) -> None:
        import dns.asyncresolver
        import dns.nameserver

        self.resolver = dns.asyncresolver.Resolver(configure=False)
        self.resolver.nameservers = [
            dns.nameserver.Do53Nameserver(str(s.address), s.port) for s in servers
        ]
        self.resolver.lifetime = timeout

    async def addresses(self, host: str, port: int) -> list[IPAddress]:
        import dns.exception

        answers = await asyncio.gather(
            *(self._ask(host, kind) for kind in ("A", "AAAA")), return_exceptions=True
        )
        found: list[IPAddress] = []
        for answer in answers:
            if isinstance(answer, dns.exception.DNSException):
                continue  # NXDOMAIN, no answer of this kind, a timeout: the other may do
            if isinstance(answer, BaseException):
                raise answer
            found += answer
        if not found:
            raise NotResolved(f"{host} does not resolve")
        return _unique(found)

    async def _ask(self, host: str, kind: str) -> list[IPAddress]:
        answer = await self.resolver.resolve(host, kind, search=False)
        return [ip_address(record.address) for record in answer]


class LookupFailed(OSError):
    """A lookup with no answer either way (a timeout, SERVFAIL, a malformed reply): the
    message says which name and which resolver."""


class TxtResolver:
    """TXT records of a name (`mailbag domains check`), asked of the servers
    DNS_NAMESERVERS names, else of the system's (resolv.conf), with dnspython."""

    def __init__(self, servers: Sequence[Nameserver] = (), *, timeout: float = 5.0) -> None:
        import dns.asyncresolver
        import dns.nameserver

        if servers:
            self.resolver = dns.asyncresolver.Resolver(configure=False)
            self.resolver.nameservers = [
                dns.nameserver.Do53Nameserver(str(s.address), s.port) for s in servers
            ]
        else:
            self.resolver = dns.asyncresolver.Resolver()
        self.resolver.lifetime = timeout
        self.servers = ", ".join(_named(n) for n in self.resolver.nameservers) or "none"

    async def txt(self, name: str) -> list[str]:
        """Every TXT value at `name`, its strings joined (RFC 7208 3.3); [] when the name
        does not exist or has none. LookupFailed otherwise."""
        import dns.exception
        import dns.resolver

        try:
            answer = await self.resolver.resolve(name, "TXT", search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.Timeout:
            raise LookupFailed(f"TXT {name}: no answer from {self.servers} in time") from None
        except dns.resolver.NoNameservers:
            raise LookupFailed(
                f"TXT {name}: no server gave a usable answer "
                f"(SERVFAIL, REFUSED or a malformed reply): {self.servers}"
            ) from None
        except dns.exception.DNSException as exc:  # SERVFAIL, a malformed reply, ...
            reason = type(exc).__name__
            raise LookupFailed(f"TXT {name}: {reason} from {self.servers}") from None
        return [b"".join(record.strings).decode("utf-8", "replace") for record in answer]


def resolver_for(dns_nameservers: str) -> Resolver:
    """DnsResolver for DNS_NAMESERVERS, else the system's."""
    servers = nameservers(dns_nameservers)
    return DnsResolver(servers) if servers else SystemResolver()


def _named(server: object) -> str:
    """A resolver as messages name it: `host:port`."""
    address, port = getattr(server, "address", server), getattr(server, "port", DNS_PORT)
    return f"[{address}]:{port}" if ":" in str(address) else f"{address}:{port}"


def _unique(addresses: Iterable[IPAddress]) -> list[IPAddress]:
    return list(dict.fromkeys(addresses))
