"""What the providers that speak an ESP's JSON HTTP API share (brevo, postmark, resend), so
each of them is its payload, its answer table and its lookups.

- One `httpx.AsyncClient` per provider (`new_client`), its pool as large as the worker's
  concurrency, so sends reuse connections and never queue behind each other beyond that.
- A request never raises for a transport failure (`call`): it comes back as an `Answer`
  that says what became of it, and `no_answer` turns one without an HTTP answer into an
  outcome class and a text through the one table, `TRANSPORT_TABLE`.
- Request bodies are compact UTF-8 JSON written by orjson (`encode_json`).
- What the JSON APIs carry the same way: the custom headers of an email, in layers
  (`custom_headers`), and an address as a `Name <address>` string (`mailbox`).
- A batch cut into calls that run concurrently gives its outcomes back in the emails'
  order (`in_order`).
- What such a provider is made of (`ApiProvider`): its key (never shown), its base URL,
  its one client, and the settings it is built from (`<NAME>_API_KEY`, `<NAME>_BASE_URL`,
  `<NAME>_TIMEOUT`, the worker's CONCURRENCY as its pool).
"""

from __future__ import annotations

import asyncio
import functools
import re
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from email.headerregistry import Address as HeaderAddress
from typing import TYPE_CHECKING, Any, Final, Self

import httpx
import orjson
from email_validator.rfc_constants import ATEXT

from mailbag.compose import OutgoingEmail
from mailbag.domain import delivery
from mailbag.providers.base import Sighting
from mailbag.providers.kit import (
    OutcomeClass,
    OutcomeTable,
    ascii_envelope_address,
    describe,
    failure_outcome,
    first_match,
    scrub,
)

if TYPE_CHECKING:
    from mailbag.settings import Settings

TRANSPORT_TABLE: Final[OutcomeTable] = (
    # The request never left: no connection, or none free in our pool.
    (httpx.ConnectError, delivery.Deferred),
    (httpx.ConnectTimeout, delivery.Deferred),
    (httpx.PoolTimeout, delivery.Deferred),
    (httpx.UnsupportedProtocol, delivery.Deferred),
    # The request (or part of it) left and the connection failed before an answer.
    (httpx.ReadTimeout, delivery.Ambiguous),
    (httpx.WriteTimeout, delivery.Ambiguous),
    (httpx.RemoteProtocolError, delivery.Ambiguous),
    (httpx.ReadError, delivery.Ambiguous),
    (httpx.WriteError, delivery.Ambiguous),
)
"""How a request that got no HTTP answer becomes an outcome (the first matching class wins;
any other transport error is Ambiguous). Ambiguous is keyed for single sends only."""


@dataclass(frozen=True)
class Answer:
    """What one request came back with, before a provider's table turns it into outcomes."""

    status: int | None = None  # None: no HTTP answer at all
    body: Any = None  # the parsed JSON; None when there was none or it was not JSON
    headers: httpx.Headers | None = None
    transport_error: httpx.TransportError | None = None
    unreadable: str | None = None  # an answer came, but reading or parsing it failed


def new_client(
    base_url: str, *, timeout: float, max_connections: int, headers: Mapping[str, str]
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(timeout),
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        ),
        headers=dict(headers),
    )


def encode_json(payload: Mapping[str, Any] | list[Any]) -> bytes:
    """A request body: compact UTF-8 JSON, the bytes httpx's `json=` (the standard json
    module) wrote, at a sixth of its cost (a 1,000-version Brevo call is about 375 KiB)."""
    return orjson.dumps(payload)


# Each client's send URLs by path. httpx parses a path and merges it with the base URL on
# every request (about 85 µs of building one, 40 µs of a send in bench/provider_cpu.py),
# and a provider sends to a handful of paths; lookups (GET) have a path per record, and
# are not kept.
_SEND_URLS: Final[weakref.WeakKeyDictionary[httpx.AsyncClient, dict[str, httpx.URL]]] = (
    weakref.WeakKeyDictionary()
)


def _send_url(client: httpx.AsyncClient, path: str) -> httpx.URL:
    """The URL httpx would send `path` to with this client, merged once."""
    urls = _SEND_URLS.setdefault(client, {})
    url = urls.get(path)
    if url is None:
        url = urls[path] = client.build_request("POST", path).url
    return url


async def call(
    client: httpx.AsyncClient,
    method: str,
    path: str,
    *,
    headers: Mapping[str, str],
    json: Mapping[str, Any] | list[Any] | None = None,
    encoded: bytes | None = None,
    params: Mapping[str, str | int] | None = None,
    data: Mapping[str, str | list[str]] | None = None,
    files: Mapping[str, tuple[str, bytes, str]] | None = None,
) -> Answer:
    """One request, its JSON body (if any) sent as `encode_json` writes it (`json`, or
    `encoded`: bytes it wrote already), or its multipart form: `data` (a list value repeats
    the field) and `files` (name, bytes, content type), as Mailgun's messages.mime takes
    them."""
    request_headers = dict(headers)
    content = encoded
    if json is not None:
        content = encode_json(json)
    if content is not None:
        request_headers["content-type"] = "application/json"
    try:
        request = client.build_request(
            method,
            _send_url(client, path) if method == "POST" else path,
            content=content,
            headers=request_headers,
            params=params,
            data=data,
            files=files,
        )
        if files:
            # The same bytes in one write: httpx streams a form a write per part (18 for
            # Mailgun's), each about 30 µs of CPU through anyio.
            request.read()
        response = await client.send(request)
    except httpx.TransportError as exc:
        return Answer(transport_error=exc)
    except httpx.HTTPError as exc:  # e.g. a body that would not decode: it was sent
        return Answer(unreadable=describe(exc))
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = None
    return Answer(status=response.status_code, body=body, headers=response.headers)


@dataclass(frozen=True)
class Answers:
    """How a provider reads its API's answer to a request for one email: its name (for
    error texts), its outcome table, where an accepting answer carries the message's id,
    and the text of an error answer."""

    provider: str
    table: OutcomeTable
    message_id: Callable[[Answer], str | None]
    error_text: Callable[[int, Any], str]

    def unkeyed_outcome(
        self,
        answer: Answer,
        *,
        secret: str | None,
        code: str | None = None,
        retry_after: timedelta | None = None,
    ) -> delivery.SendOutcome:
        """The outcome of such a request that carried no key of its own (the ESP has none,
        so an Ambiguous one is never resent): Accepted under the answer's id, else what the
        table (by `code` and status) or TRANSPORT_TABLE names, its error text scrubbed of
        `secret`. An answer the table accepts without an id is Ambiguous: something was
        taken, and nothing says what."""
        failed = no_answer(answer, self.provider)
        if failed is not None:
            found, text = failed
        else:
            assert answer.status is not None
            found = first_match(self.table, code=code, status=answer.status)
            taken = self.message_id(answer) if found is delivery.Accepted else None
            if taken:
                return delivery.Accepted(taken)
            if found is delivery.Accepted:
                found = delivery.Ambiguous
                text = f"{self.provider} answered {answer.status} without a message id"
            else:
                text = self.error_text(answer.status, answer.body)
        return failure_outcome(found, scrub(text, secret), keyed=False, retry_after=retry_after)


def no_answer(answer: Answer, provider: str) -> tuple[OutcomeClass, str] | None:
    """The outcome class and the (unscrubbed) error text of a request that got no usable
    HTTP answer; None when it got one, for the provider's own table to read."""
    if answer.transport_error is not None:
        found = first_match(TRANSPORT_TABLE, error=answer.transport_error)
        return found, f"{provider} request failed: {describe(answer.transport_error)}"
    if answer.status is None:
        return delivery.Ambiguous, f"{provider} answer unreadable: {answer.unreadable}"
    return None


def custom_headers(email: OutgoingEmail, ours: Mapping[str, str]) -> dict[str, str]:
    """The caller's headers, then List-Unsubscribe(-Post), then `ours`: each later one
    replaces an earlier one of the same name in any case (ESPs recase header names)."""
    unsubscribe = email.list_unsubscribe
    if not email.headers and not unsubscribe:  # what nearly every email has: ours alone
        return dict(ours)
    headers: dict[str, str] = {}
    for layer in (email.headers, unsubscribe, ours):
        names = {name.lower() for name in layer}
        headers = {k: v for k, v in headers.items() if k.lower() not in names}
        headers.update(layer)
    return headers


def add_nonempty(payload: dict[str, Any], *fields: tuple[str, Any]) -> None:
    """Add the fields that have a value, in order: an email's optional parts (Cc, Reply-To,
    a body it does not have) are left out of a request, never sent empty."""
    for name, value in fields:
        if value:
            payload[name] = value


# A dot-atom address: HeaderAddress parses it back to itself and writes it unquoted.
_PLAIN_ADDRESS: Final = re.compile(rf"[{ATEXT}]+(?:\.[{ATEXT}]+)*@[{ATEXT}]+(?:\.[{ATEXT}]+)*")
# A display name with none of RFC 5322's specials (email._header_value_parser.SPECIALS),
# nor CR or LF (which HeaderAddress refuses), goes unquoted.
_NAME_SPECIALS: Final = frozenset('()<>@,:;."[]\\\r\n')


def mailbox(provider: str, address: str, name: str | None) -> str:
    """`Name <address>` as an API that takes address strings wants it: the name quoted
    where RFC 5322 needs it (a comma, a quote), left in UTF-8; the domain in its ASCII
    (IDNA) form; a non-ASCII local part refused (`kit.ascii_envelope_address`)."""
    ascii_form = ascii_envelope_address(provider, address)
    if not name:
        return ascii_form
    if _PLAIN_ADDRESS.fullmatch(ascii_form) and _NAME_SPECIALS.isdisjoint(name):
        # What nearly every mailbox is, written as HeaderAddress writes it, without its
        # parse of the address (a quarter of a Postmark or Resend payload's cost).
        return f"{name} <{ascii_form}>"
    return str(HeaderAddress(display_name=name, addr_spec=ascii_form))


@functools.lru_cache(maxsize=256)
def sender(provider: str, address: str, name: str | None) -> str:
    """`mailbox` of a From: a handful of senders write every email's From, so each is
    written once (a refusal is not kept: it is raised again)."""
    return mailbox(provider, address, name)


async def in_order(
    count: int, calls: Sequence[tuple[Sequence[int], Awaitable[list[delivery.SendOutcome]]]]
) -> list[delivery.SendOutcome]:
    """Run the calls concurrently; each is the indexes of the emails it carries and what
    sends them (one outcome per index, in order). The outcomes of all `count` emails, in
    the emails' order."""
    results = await asyncio.gather(*(send for _, send in calls))
    outcomes: list[delivery.SendOutcome | None] = [None] * count
    for (indexes, _), chunk_outcomes in zip(calls, results, strict=True):
        for index, outcome in zip(indexes, chunk_outcomes, strict=True):
            outcomes[index] = outcome
    missing = [index for index, outcome in enumerate(outcomes) if outcome is None]
    if missing:
        raise AssertionError(f"no outcome for emails {missing}")
    return [outcome for outcome in outcomes if outcome is not None]


def sighting(provider_id: str, message_id: uuid.UUID | None, recipients: object) -> Sighting:
    """A lookup's record as a `Sighting`: its first recipient, if the list has one."""
    first = recipients[0] if isinstance(recipients, list) and recipients else None
    return Sighting(
        provider_message_id=provider_id,
        message_id=message_id,
        recipient=first if isinstance(first, str) else None,
    )


class ApiProvider:
    """The base of a provider that speaks an ESP's HTTP API. A subclass names itself
    (`name`, the `<name>_api_key`, `_base_url` and `_timeout` settings it reads) and adds
    its own settings to `from_settings` by overriding `settings_for`."""

    name: str
    default_base_url: str

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str | None = None,
        timeout: float = 30.0,
        max_connections: int = 32,
    ) -> None:
        self._api_key = api_key or None  # an empty key is no key
        self.base_url = (base_url or self.default_base_url).rstrip("/")
        # One client for all sends, its pool as large as the worker's concurrency, so sends
        # reuse connections and never queue behind each other beyond that.
        self._client = new_client(
            self.base_url,
            timeout=timeout,
            max_connections=max_connections,
            headers={"accept": "application/json"},
        )

    def __repr__(self) -> str:  # never show the key
        key = "set" if self._api_key else "missing"
        return f"{type(self).__name__}(base_url={self.base_url!r}, api_key={key})"

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls(**cls.settings_for(settings))

    @classmethod
    def settings_for(cls, settings: Settings) -> dict[str, Any]:
        """The constructor's arguments, from this provider's own settings only."""
        key = getattr(settings, f"{cls.name}_api_key")
        return {
            "api_key": key.get_secret_value() if key else None,
            "base_url": getattr(settings, f"{cls.name}_base_url"),
            "timeout": getattr(settings, f"{cls.name}_timeout"),
            "max_connections": settings.concurrency,
        }

    @property
    def missing_key(self) -> delivery.Disabled:
        """What a send is without a key: nothing can go until an operator sets one."""
        return delivery.Disabled(f"{self.name.upper()}_API_KEY is not set")

    async def aclose(self) -> None:
        await self._client.aclose()
