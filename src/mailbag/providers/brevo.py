"""`brevo`: Brevo's (ex-Sendinblue) transactional email HTTP API.

One email is `POST /v3/smtp/email` with `to`; several share one call through
`messageVersions` (up to 1000 versions, no outer `to`). Every answer and every transport
failure is classified by the one table below, `RESPONSE_TABLE` (with `TRANSPORT_TABLE` for
requests that got no answer).

Idempotency: a single send carries `headers.idempotencyKey`, a UUID derived from the email's
own key (message id and attempt), so sending the same email again after an ambiguous
failure sends the same key and Brevo, for 30 minutes, does not process it twice. Brevo
answers such a repeat with a `duplicate_parameter` error rather than the first message id;
that answer says "I already have a request with this key" but not what became of it, so it
is classified Ambiguous (unkeyed: repeating it cannot tell more) and left to reconciliation.
A batch call carries no per-email key, so its ambiguous outcomes are never resent.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, TypeVar

import httpx

from mailbag.compose import MESSAGE_ID_HEADER, OutgoingEmail, message_id_from_rfc
from mailbag.domain.delivery import Accepted, Ambiguous, Deferred, Disabled, Rejected, SendOutcome
from mailbag.domain.message import Message, ascii_address
from mailbag.providers import register
from mailbag.providers.base import Sighting
from mailbag.providers.kit import (
    OutcomeTable,
    ascii_envelope_address,
    describe,
    failure_outcome,
    first_match,
    retry_after,
    scrub,
)

if TYPE_CHECKING:
    from mailbag.settings import Settings

SEND_PATH: Final = "/v3/smtp/email"
LIST_PATH: Final = "/v3/smtp/emails"
MAX_VERSIONS_PER_CALL: Final = 1000
# Brevo remembers an idempotencyKey for 30 minutes.
IDEMPOTENCY_WINDOW: Final = timedelta(minutes=30)
# Brevo requires idempotencyKey to be a UUID; ours is not one, so we send its UUIDv5 under
# this fixed namespace. Never change it: in-flight retries would stop matching.
IDEMPOTENCY_NAMESPACE: Final = uuid.UUID("6f1d3c2a-9a57-4b8e-a0f4-5b1e2d7c9e31")
# Where a Deferred's retry_after comes from, first found first: Brevo's own rate limit
# reset (seconds), else the standard header.
RETRY_AFTER_HEADERS: Final = ("x-sib-ratelimit-reset", "retry-after")
# Brevo's error code for a request whose idempotencyKey it has already seen.
DUPLICATE_KEY_CODES: Final = frozenset({"duplicate_parameter", "duplicate_request"})
LOOKUP_PAGE_SIZE: Final = 1000
LOOKUP_MAX_PAGES: Final = 50

T = TypeVar("T")


RESPONSE_TABLE: Final[OutcomeTable] = (
    # The first row whose status matches wins; a status in no row is Ambiguous.
    (range(200, 203), Accepted),  # with a messageId (or messageIds); without: Ambiguous
    (range(203, 300), Ambiguous),  # another 2xx: success of some kind, but no id
    (range(300, 400), Deferred),  # a redirect: not processed (check BREVO_BASE_URL)
    (408, Deferred),  # request timeout: Brevo gave up before processing
    (425, Deferred),  # too early: not processed
    (429, Deferred),  # rate limited: retry after x-sib-ratelimit-reset
    # 400/401/403/422 and the other 4xx: the same request will be refused again. Except a
    # keyed send's duplicate_parameter: Ambiguous, keyed=False (see the module doc).
    (range(400, 500), Rejected),
    (range(500, 600), Deferred),  # Brevo answered with an error: it did not take it
)
"""How an HTTP answer from `POST /v3/smtp/email` becomes an outcome. A Deferred carries
`RETRY_AFTER_HEADERS` as its retry_after; error texts carry the status and Brevo's `code`
and `message`, never the API key."""

TRANSPORT_TABLE: Final[OutcomeTable] = (
    # The request never left: no connection, or none free in our pool.
    (httpx.ConnectError, Deferred),
    (httpx.ConnectTimeout, Deferred),
    (httpx.PoolTimeout, Deferred),
    (httpx.UnsupportedProtocol, Deferred),
    # The request (or part of it) left and the connection failed before an answer.
    (httpx.ReadTimeout, Ambiguous),
    (httpx.WriteTimeout, Ambiguous),
    (httpx.RemoteProtocolError, Ambiguous),
    (httpx.ReadError, Ambiguous),
    (httpx.WriteError, Ambiguous),
)
"""How a request that got no HTTP answer becomes an outcome (the first matching class wins;
any other transport error is Ambiguous). Ambiguous is keyed for single sends only."""


class BrevoLookupError(RuntimeError):
    """`GET /v3/smtp/emails` failed: no answer, or an answer that is not the list."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def brevo_idempotency_key(email: OutgoingEmail) -> str:
    """The UUID sent as `headers.idempotencyKey`: a function of the email's key alone."""
    return str(uuid.uuid5(IDEMPOTENCY_NAMESPACE, email.idempotency_key))


def _address(address: str, name: str | None) -> dict[str, str]:
    """A Brevo address object. Brevo's schema wants `format: email`: an IDN domain goes in
    its ASCII (punycode) form; a non-ASCII local part it cannot carry at all (enqueue
    refuses it for this provider, see `supports_utf8_local_part`)."""
    email = ascii_envelope_address("brevo", address)
    return {"email": email, "name": name} if name else {"email": email}


def single_payload(email: OutgoingEmail) -> dict[str, Any]:
    """The body of a one-email send, carrying this email's ids and idempotency key."""
    payload: dict[str, Any] = {
        "sender": _address(email.from_email, email.from_name),
        "to": [_address(email.to_email, email.to_name)],
        "subject": email.subject,
        "htmlContent": email.html,
    }
    if email.text:
        payload["textContent"] = email.text
    payload["headers"] = {
        **email.headers,
        # Ours last, so a caller's header of the same name cannot replace them.
        MESSAGE_ID_HEADER: str(email.message_id),
        "Message-Id": email.rfc_message_id,
        "idempotencyKey": brevo_idempotency_key(email),
    }
    # A tag naming our message lets reconciliation find this send in Brevo's records.
    payload["tags"] = [*email.tags, lookup_tag(email.message_id)]
    return payload


def lookup_tag(message_id: uuid.UUID) -> str:
    return f"mailbag-{message_id}"


def batch_payload(emails: Sequence[OutgoingEmail]) -> dict[str, Any]:
    """One call for emails that share sender, tags and custom headers (see `_batch_group`).

    Brevo's message versions carry only recipients, subject and bodies: no headers and no
    tags. So the per-email Message-Id, X-Mailbag-Message-ID and idempotency key cannot
    travel in a batch; the returned message ids, in order, are what ties each email to
    Brevo's record.
    """
    first = emails[0]
    versions: list[dict[str, Any]] = []
    for email in emails:
        version: dict[str, Any] = {
            "to": [_address(email.to_email, email.to_name)],
            "subject": email.subject,
            "htmlContent": email.html,
        }
        if email.text:
            version["textContent"] = email.text
        versions.append(version)
    # Brevo wants a top-level subject and body when no template is used; every version
    # overrides them, so the first email's serve.
    payload: dict[str, Any] = {
        "sender": _address(first.from_email, first.from_name),
        "subject": first.subject,
        "htmlContent": first.html,
        "messageVersions": versions,
    }
    if first.headers:
        payload["headers"] = dict(first.headers)
    if first.tags:
        payload["tags"] = list(first.tags)
    return payload


def _batch_group(email: OutgoingEmail) -> tuple[Any, ...]:
    """What must be equal for emails to share one call: all that is not per version."""
    return (
        email.from_email,
        email.from_name,
        tuple(email.tags),
        tuple(sorted(email.headers.items())),
    )


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(frozen=True)
class _Answer:
    """What one send request came back with, before it is turned into outcomes."""

    status: int | None = None  # None: no HTTP answer at all
    body: Any = None
    headers: httpx.Headers | None = None
    transport_error: httpx.TransportError | None = None
    unreadable: str | None = None  # an answer came, but reading or parsing it failed


class BrevoProvider:
    name = "brevo"
    max_batch_size = MAX_VERSIONS_PER_CALL
    idempotency_window: timedelta | None = IDEMPOTENCY_WINDOW
    supports_utf8_local_part = False  # its schema's `format: email` is ASCII only

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str = "https://api.brevo.com",
        timeout: float = 30.0,
        max_connections: int = 32,
    ) -> None:
        self._api_key = api_key or None  # an empty key is no key
        self.base_url = base_url.rstrip("/")
        # One client for all sends, its pool as large as the worker's concurrency, so sends
        # reuse connections and never queue behind each other beyond that.
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            headers={"accept": "application/json"},
        )

    def __repr__(self) -> str:  # never show the key
        key = "set" if self._api_key else "missing"
        return f"BrevoProvider(base_url={self.base_url!r}, api_key={key})"

    @classmethod
    def from_settings(cls, settings: Settings) -> BrevoProvider:
        key = settings.brevo_api_key
        return cls(
            api_key=key.get_secret_value() if key else None,
            base_url=settings.brevo_base_url,
            timeout=settings.brevo_timeout,
            max_connections=settings.concurrency,
        )

    # --- sending -----------------------------------------------------------------------

    async def send(self, email: OutgoingEmail) -> SendOutcome:
        if self._api_key is None:
            return Disabled("BREVO_API_KEY is not set")
        try:
            payload = single_payload(email)
        except ValueError as exc:  # nothing Brevo could take: an address it cannot carry
            return Rejected(f"cannot build the Brevo request: {exc}")
        answer = await self._post(payload)
        return self._outcomes(answer, count=1, keyed=True)[0]

    async def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[SendOutcome]:
        """One outcome per email, in order. Emails are grouped by what a call shares and each
        group is sent in calls of at most 1000 versions, the calls concurrently."""
        if self._api_key is None:
            return [Disabled("BREVO_API_KEY is not set")] * len(emails)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, email in enumerate(emails):
            groups.setdefault(_batch_group(email), []).append(index)
        calls = [
            chunk
            for indexes in groups.values()
            for chunk in _chunks(indexes, MAX_VERSIONS_PER_CALL)
        ]
        results = await asyncio.gather(
            *(self._send_call([emails[i] for i in chunk]) for chunk in calls)
        )
        outcomes: list[SendOutcome | None] = [None] * len(emails)
        for chunk, chunk_outcomes in zip(calls, results, strict=True):
            for index, outcome in zip(chunk, chunk_outcomes, strict=True):
                outcomes[index] = outcome
        assert all(outcome is not None for outcome in outcomes)
        return [outcome for outcome in outcomes if outcome is not None]

    async def _send_call(self, emails: Sequence[OutgoingEmail]) -> list[SendOutcome]:
        if len(emails) == 1:  # a single send carries a key: strictly safer
            return [await self.send(emails[0])]
        try:
            payload = batch_payload(emails)
        except ValueError:  # one email Brevo cannot carry: send each alone, only it fails
            return list(await asyncio.gather(*(self.send(email) for email in emails)))
        answer = await self._post(payload)
        if answer.status == 400:
            # One bad version fails the whole call and nothing is sent: send each email on
            # its own (keyed) so only the bad one fails.
            return list(await asyncio.gather(*(self.send(email) for email in emails)))
        return self._outcomes(answer, count=len(emails), keyed=False)

    async def _post(self, payload: dict[str, Any]) -> _Answer:
        assert self._api_key is not None
        try:
            response = await self._client.post(
                SEND_PATH,
                json=payload,
                headers={"api-key": self._api_key, "content-type": "application/json"},
            )
        except httpx.TransportError as exc:
            return _Answer(transport_error=exc)
        except httpx.HTTPError as exc:  # e.g. a body that would not decode: it was sent
            return _Answer(unreadable=describe(exc))
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = None
        return _Answer(status=response.status_code, body=body, headers=response.headers)

    def _outcomes(self, answer: _Answer, *, count: int, keyed: bool) -> list[SendOutcome]:
        """Apply the tables: `count` emails were in the request, in order."""
        if answer.transport_error is not None:
            found = first_match(TRANSPORT_TABLE, error=answer.transport_error)
            text = f"Brevo request failed: {describe(answer.transport_error)}"
        elif answer.status is None:
            found, text = Ambiguous, f"Brevo answer unreadable: {answer.unreadable}"
        else:
            status, body = answer.status, answer.body
            found, text = first_match(RESPONSE_TABLE, status=status), _error_text(status, body)
            if found is Accepted:
                ids = _message_ids(body, count)
                if ids is not None:
                    return [Accepted(message_id) for message_id in ids]
                found = Ambiguous
                text = f"Brevo answered {status} without usable message ids: {body!r}"
        text = scrub(text, self._api_key)
        if found is Rejected and keyed and _error_code(answer.body) in DUPLICATE_KEY_CODES:
            text += (
                " (an earlier request with this idempotency key reached Brevo: whether it "
                "was sent needs reconciliation)"
            )
            return [Ambiguous(text, keyed=False)] * count
        hint = retry_after(answer.headers, RETRY_AFTER_HEADERS) if answer.headers else None
        return [failure_outcome(found, text, keyed=keyed, retry_after=hint)] * count

    # --- reading back ------------------------------------------------------------------

    async def lookup(
        self,
        *,
        message_id: str | None = None,
        email: str | None = None,
        tag: str | None = None,
    ) -> list[dict[str, Any]]:
        """Brevo's own records of sent transactional emails (`GET /v3/smtp/emails`), last 30
        days, as its dicts (`email`, `subject`, `messageId`, `uuid`, `date`, `tags`, ...).

        Brevo filters by `messageId` or recipient `email` (one is required); it has no tag
        filter on this endpoint, so `tag` narrows the result here. Empty when none match.
        Raises BrevoLookupError when the list cannot be had.
        """
        if self._api_key is None:
            raise BrevoLookupError("BREVO_API_KEY is not set")
        if message_id is None and email is None:
            raise ValueError("Brevo looks up sent emails by message_id or email (tag only narrows)")
        query: dict[str, str | int] = {"limit": LOOKUP_PAGE_SIZE}
        if message_id is not None:
            query["messageId"] = message_id
        if email is not None:
            query["email"] = email
        found: list[dict[str, Any]] = []
        for page in range(LOOKUP_MAX_PAGES):
            records = await self._lookup_page({**query, "offset": page * LOOKUP_PAGE_SIZE})
            found.extend(records)
            if len(records) < LOOKUP_PAGE_SIZE:
                break
        if tag is not None:
            found = [record for record in found if tag in (record.get("tags") or [])]
        return found

    async def find_sent(self, message: Message, rfc_message_id: str) -> list[Sighting]:
        """Brevo's records that may be of one of our messages, each saying whose it is.

        Looks by recipient and our per-message tag (single sends carry it), then by our
        Message-ID in case Brevo kept it. Which message a record belongs to comes from the
        record itself (its tag, or its message id); reconciliation settles a message only
        from a record of its own. Raises BrevoLookupError when Brevo cannot say."""
        found = await self.lookup(
            email=ascii_address(message.to_address), tag=lookup_tag(message.id)
        )
        if not found:
            found = await self.lookup(message_id=rfc_message_id)
        return [sighting for record in found if (sighting := _sighting(record)) is not None]

    async def _lookup_page(self, query: Mapping[str, str | int]) -> list[dict[str, Any]]:
        assert self._api_key is not None
        try:
            response = await self._client.get(
                LIST_PATH, params=dict(query), headers={"api-key": self._api_key}
            )
        except httpx.HTTPError as exc:
            text = scrub(f"Brevo lookup failed: {describe(exc)}", self._api_key)
            raise BrevoLookupError(text) from exc
        try:
            body = response.json() if response.content else {}
        except ValueError:
            body = None
        if response.status_code == 404 and _error_code(body) == "document_not_found":
            return []  # Brevo's way of saying "no such email"
        if response.status_code != 200 or not isinstance(body, dict):
            raise BrevoLookupError(
                scrub(f"lookup: {_error_text(response.status_code, body)}", self._api_key),
                status=response.status_code,
            )
        records = body.get("transactionalEmails") or []
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            text = scrub(f"lookup: unexpected answer shape: {body!r}", self._api_key)
            raise BrevoLookupError(text)
        return records

    async def aclose(self) -> None:
        await self._client.aclose()


def _sighting(record: Mapping[str, Any]) -> Sighting | None:
    """What one of Brevo's records proves: which of our messages it is (from our tag on it,
    else from our Message-ID if Brevo kept it), sent to whom, under which Brevo id."""
    provider_id = record.get("messageId")
    if not isinstance(provider_id, str) or not provider_id:
        return None
    ours: uuid.UUID | None = None
    for tag in record.get("tags") or []:
        if isinstance(tag, str) and tag.startswith("mailbag-"):
            try:
                ours = uuid.UUID(tag.removeprefix("mailbag-"))
            except ValueError:
                continue
            break
    if ours is None:
        ours = message_id_from_rfc(provider_id)
    recipient = record.get("email")
    return Sighting(
        provider_message_id=provider_id,
        message_id=ours,
        recipient=recipient if isinstance(recipient, str) else None,
    )


def _message_ids(body: Any, count: int) -> list[str] | None:
    """The ids a 2xx carries, one per email in order; None when they are not all there."""
    if not isinstance(body, dict):
        return None
    if count == 1 and isinstance(body.get("messageId"), str) and body["messageId"]:
        return [body["messageId"]]
    ids = body.get("messageIds")
    if isinstance(ids, list) and len(ids) == count and all(isinstance(i, str) and i for i in ids):
        return list(ids)
    return None


def _error_code(body: Any) -> str | None:
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


def _error_text(status: int, body: Any) -> str:
    if isinstance(body, dict) and ("code" in body or "message" in body):
        return f"Brevo HTTP {status} {body.get('code', '')}: {body.get('message', '')}"
    return f"Brevo HTTP {status}" + (f": {body!r}" if body else "")


register("brevo")(BrevoProvider.from_settings)
