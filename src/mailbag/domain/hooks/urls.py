"""Where an event hook may be sent: one rule, applied when an endpoint is registered and
again when each delivery connects (worker/hook_http.py), so that nothing accepted can fail
to parse or reach somewhere it must not later.

A URL is parsed with httpx's own parser (`httpx.URL`, a pure value type: the sender's), so
a URL it refuses (`https://0177.0.0.1/`, `https://☃.example/`, `https://xn--a.example/`)
is refused here, at registration, instead of killing a delivery later. Then:

- `https://` (and `http://` only to loopback, with the development flag), a host, a port
  from 1 to 65535, no credentials, no #fragment, at most URL_MAX characters, no spaces or
  control characters;
- a host named by address must be one the policy allows (`address_problem`): never
  unspecified, link-local, multicast, reserved, a cloud metadata address, nor an IPv4
  address dressed as IPv6 (mapped, 6to4, NAT64) that is one of those; loopback only with
  the development flag (HOOK_ALLOW_HTTP_LOCALHOST), private networks (RFC 1918, fc00::/7,
  100.64/10) only with HOOK_ALLOW_PRIVATE_NETWORKS;
- a host named by name must be a public DNS name: not `localhost` (unless loopback is
  allowed), not a single label (`metadata`, `intranet`), not under a special-use or
  private suffix (`.internal`, `.local`, `.home.arpa`, ...), not a cloud metadata name,
  and not ending in a number: `2130706433`, `0x7f.1` and `127.1` are IPv4 addresses to
  getaddrinfo and browsers (WHATWG's "ends in a number"), written so as to slip past a
  check of dotted quads.

A name says nothing about where it points, and can point elsewhere at the next lookup
(DNS rebinding): the sender resolves it, checks every address with `address_problem`, and
connects only to an address it checked. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

URL_MAX = 2000

# Private networks: internal receivers an operator may allow (HOOK_ALLOW_PRIVATE_NETWORKS).
PRIVATE_NETWORKS: tuple[IPv4Network | IPv6Network, ...] = tuple(
    ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
# Cloud instance metadata services: never, whatever is allowed (AWS IPv4 and IPv6, ECS task
# metadata, Alibaba; GCP and Azure answer on 169.254.169.254 too, and Azure's WireServer).
METADATA_ADDRESSES = frozenset(
    ip_address(a)
    for a in (
        "169.254.169.254",
        "169.254.170.2",
        "fd00:ec2::254",
        "100.100.100.200",
        "168.63.129.16",
    )
)
METADATA_NAMES = frozenset(
    {"metadata.google.internal", "metadata.goog", "metadata.azure.com", "instance-data"}
)
# Suffixes that never name a public receiver: RFC 6761/6762/8375/7686 special-use names,
# ICANN's private-use .internal, and reverse-DNS names.
PRIVATE_SUFFIXES = (
    ".internal",
    ".local",
    ".localdomain",
    ".home.arpa",
    ".arpa",
    ".onion",
    ".invalid",
    ".test",
)
# IPv6 prefixes that carry an IPv4 address in their last 32 bits (NAT64, RFC 6052/8215).
NAT64 = (ip_network("64:ff9b::/96"), ip_network("64:ff9b:1::/48"))


class UnsafeUrl(ValueError):
    """A hook URL the rules refuse; the message says why (no secret is ever in a URL we
    accept, and a refused URL is the operator's own input)."""


@dataclass(frozen=True)
class Policy:
    """What a deployment lets hooks reach beyond the public internet."""

    allow_loopback: bool = False  # HOOK_ALLOW_HTTP_LOCALHOST: development and tests
    allow_private: bool = False  # HOOK_ALLOW_PRIVATE_NETWORKS: internal receivers


@dataclass(frozen=True)
class Destination:
    """A URL that passed the rule: the parsed URL, and its host as a name or an address."""

    url: httpx.URL
    host: str  # lower case; IDNA-encoded (what DNS is asked)
    address: IPv4Address | IPv6Address | None  # the host, when it is an address


def check(url: str, policy: Policy) -> Destination:
    """`url` parsed and checked, or UnsafeUrl saying what is wrong."""
    import httpx  # the sender's parser; imported here, not on every command's start

    text = url.strip()
    if not text or len(text) > URL_MAX:
        raise UnsafeUrl(f"must be 1 to {URL_MAX} characters")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise UnsafeUrl("must not contain spaces or control characters")
    try:
        parsed = httpx.URL(text)
        parsed.host  # noqa: B018 - decodes xn-- labels, as the sender does: a bad one raises
        httpx.Request("POST", parsed)  # what the sender builds from it
    except (httpx.InvalidURL, UnicodeError, ValueError) as exc:  # idna raises UnicodeErrors
        raise UnsafeUrl(f"is not a valid URL: {exc}") from None
    if parsed.scheme not in ("https", "http") or not parsed.raw_host:
        raise UnsafeUrl("must be an https:// URL with a host")
    if parsed.userinfo:
        raise UnsafeUrl("must not carry credentials; the signature authenticates mailbag")
    if parsed.fragment:
        raise UnsafeUrl("must not have a #fragment")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise UnsafeUrl("must have a port from 1 to 65535")
    host = parsed.raw_host.decode("ascii").lower()
    address = _address(host)
    if address is not None:
        problem = address_problem(address, policy)
        if problem:
            raise UnsafeUrl(f"names {problem}")
        loopback = address.is_loopback or _is_mapped_loopback(address)
    else:
        problem = name_problem(host, policy)
        if problem:
            raise UnsafeUrl(problem)
        loopback = is_loopback_name(host)
    if parsed.scheme == "http" and not (policy.allow_loopback and loopback):
        raise UnsafeUrl(
            "must use https://"
            if not policy.allow_loopback
            else "may use http:// only for localhost (HOOK_ALLOW_HTTP_LOCALHOST)"
        )
    return Destination(parsed, host.rstrip("."), address)


def address_problem(address: IPv4Address | IPv6Address, policy: Policy) -> str | None:
    """Why hooks must not go to `address` ("a loopback address", ...), or None."""
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        problem = address_problem(embedded, policy)
        return f"{problem} (as IPv6)" if problem else None
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if address.is_loopback:
        return None if policy.allow_loopback else "a loopback address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if any(address in network for network in PRIVATE_NETWORKS):
        return None if policy.allow_private else "a private-network address"
    if not address.is_global:
        return "a reserved address"
    return None


def name_problem(host: str, policy: Policy) -> str | None:
    """Why `host` (lower case, IDNA-encoded) is no receiver's name under `policy`, or None.
    Internal names (a single label, `.internal`, `.local` ...) are private receivers' and
    pass with `allow_private`; where any name points is checked again when it connects."""
    name = host.rstrip(".")
    if is_loopback_name(name):
        return None if policy.allow_loopback else "must not name localhost"
    if name in METADATA_NAMES:
        return "must not name a cloud metadata service"
    last = name.rpartition(".")[2]
    if last.isdigit() or last.startswith("0x"):
        return "must write an IPv4 address as four decimal numbers (a.b.c.d), or use a name"
    if policy.allow_private:
        return None
    if "." not in name:
        return "must name a host by its full DNS name (a single label is not a public one)"
    if name.endswith(PRIVATE_SUFFIXES):
        return f"must not name a host under .{last} (not a public name)"
    return None


def is_loopback_name(host: str) -> bool:
    """`localhost` and its subdomains always mean this machine (RFC 6761)."""
    name = host.rstrip(".")
    return name == "localhost" or name.endswith(".localhost")


def _address(host: str) -> IPv4Address | IPv6Address | None:
    try:
        return ip_address(host)
    except ValueError:
        return None


def _embedded_ipv4(address: IPv4Address | IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, compatible, 6to4, NAT64), if any."""
    if not isinstance(address, IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in network for network in NAT64) or (
        int(address) >> 32 == 0 and int(address) > 1  # ::a.b.c.d (deprecated "compatible")
    ):
        return IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _is_mapped_loopback(address: IPv4Address | IPv6Address) -> bool:
    embedded = _embedded_ipv4(address)
    return embedded is not None and embedded.is_loopback
