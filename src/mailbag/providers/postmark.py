"""`postmark`: Postmark's email API (postmarkapp.com/developer).

One email is `POST /email`; up to 500 share one `POST /email/batch` (Postmark's limit, with
at most 50 MB a call: "Send batch emails", postmarkapp.com/developer/user-guide/
send-email-with-api/batch-emails). Both authenticate with `X-Postmark-Server-Token`
(POSTMARK_API_KEY) and send on the message stream POSTMARK_MESSAGE_STREAM (`outbound`, the
default transactional stream).

Postmark answers a refused email in its body: `ErrorCode` 0 is success, anything else is
an email Postmark did not take. A single send answers 422 with it, a batch 200 with one
result per email, in order. So an answer is read twice: its HTTP status by `RESPONSE_TABLE`
(401, 429, 5xx decide by themselves), then, where Postmark gave one, its ErrorCode by
`ERROR_CODES` (the codes of postmarkapp.com/developer/api/overview#error-codes that a send
can meet). A request that got no answer goes through `http_api.TRANSPORT_TABLE`.

Postmark has no idempotency key (`idempotency_window` is None): an ambiguous send is
`unknown` and waits for evidence, never resent.

What a message carries: `From`, `To`, `Cc`, `Bcc` and `ReplyTo` (comma-separated
`Name <address>` strings; Bcc is envelope only), `Subject`, `HtmlBody`, `TextBody`,
`Headers` (the caller's, List-Unsubscribe(-Post), our Message-ID and X-Mailbag-Message-ID),
`Attachments` (base64 `Content`, `Name`, `ContentType`; an inline image also has
`ContentID: "cid:<content id>"`, the form Postmark's own libraries send, and the HTML's
`cid:<content id>` reference stays as it is), `Metadata` `{"mailbag_message_id": <our
id>}` (so webhooks and the Messages API name our message), and `Tag`.

Postmark takes one `Tag` a message: the message's first tag goes; its other tags stay
mailbag's own labels (stored and shown with the message), as any provider's tags are.
What Postmark itself refuses is its answer to read, not guessed here: more than 50
recipients (ErrorCode 300), a forbidden attachment type (411), an unconfirmed sender (400).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from mailbag.compose import MESSAGE_ID_HEADER, OutgoingEmail
from mailbag.domain import delivery
from mailbag.domain.content import Address
from mailbag.domain.message import Message, ascii_address
from mailbag.providers import http_api, kit, register
from mailbag.providers.base import Capabilities, Sighting
from mailbag.providers.http_api import (
    Answer,
    add_nonempty,
    custom_headers,
    encode_json,
    mailbox,
    sender,
)
from mailbag.providers.kit import OutcomeClass, OutcomeTable
from mailbag.providers.postmark_events import METADATA_KEY  # webhooks echo it

if TYPE_CHECKING:
    from mailbag.settings import Settings

PROVIDER: Final = "postmark"
SEND_PATH: Final = "/email"
BATCH_PATH: Final = "/email/batch"
SEARCH_PATH: Final = "/messages/outbound"
TOKEN_HEADER: Final = "X-Postmark-Server-Token"  # noqa: S105 (a header name)
MAX_BATCH: Final = 500  # messages a batch call
MAX_BATCH_BYTES: Final = 50_000_000  # "up to 50 MB payload size, including attachments"
SEARCH_PAGE: Final = 50  # records a lookup asks for (one message: a handful at most)

RESPONSE_TABLE: Final[OutcomeTable] = (
    # Where Postmark's body has a nonzero ErrorCode, a 2xx or 4xx is decided by ERROR_CODES.
    (200, delivery.Accepted),  # with ErrorCode 0 and a MessageID; else Ambiguous
    (range(201, 300), delivery.Ambiguous),  # another 2xx: success of some kind, but not ours
    (range(300, 400), delivery.Deferred),  # a redirect: not processed (check POSTMARK_BASE_URL)
    (401, delivery.Disabled),  # "wrong or missing headers": a bad server token
    (408, delivery.Deferred),  # request timeout: Postmark gave up before processing
    (429, delivery.Throttled),  # rate limited before taking it: no attempt spent
    (422, delivery.Rejected),  # ErrorCode says why (ERROR_CODES)
    (range(400, 500), delivery.Rejected),  # the same request will be refused again
    # Postmark documents 500 as its internal error and 503 as maintenance; neither took it.
    (range(500, 600), delivery.Deferred),
)
"""How an HTTP answer from `POST /email` or `/email/batch` becomes an outcome."""

# fmt: off
ERROR_CODES: Final[Mapping[int, OutcomeClass]] = MappingProxyType({
    10: delivery.Disabled,  # bad or missing server token
    100: delivery.Deferred,  # maintenance: try later
    300: delivery.Rejected,  # invalid email request (an address, no body, > 50 recipients)
    400: delivery.Rejected,  # sender signature not found (this email's From)
    401: delivery.Rejected,  # sender signature not confirmed (this email's From)
    402: delivery.Rejected,  # invalid JSON
    403: delivery.Rejected,  # incompatible JSON
    405: delivery.Disabled,  # not allowed to send (the account: out of credits, held)
    406: delivery.Rejected,  # inactive recipient: it bounced hard or complained at Postmark
    409: delivery.Rejected,  # JSON required
    410: delivery.Rejected,  # too many batch messages (more than 500)
    411: delivery.Rejected,  # forbidden attachment type
    # The account, not the email: pending approval (it may send only to its own domain)
    # or not allowed to send. Held without spending attempts until an operator acts.
    412: delivery.Disabled,
    413: delivery.Disabled,
    429: delivery.Throttled,  # rate limit exceeded
})
# fmt: on
"""Postmark's ErrorCode (nonzero: Postmark did not take the email) -> outcome. A code not
listed is Rejected: the answer says the email was refused, and not that waiting helps."""


class PostmarkLookupError(RuntimeError):
    """`GET /messages/outbound` failed: no answer, or an answer that is not the list."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _mailboxes(addresses: Sequence[Address]) -> str:
    return ", ".join(mailbox(PROVIDER, a.address, a.name) for a in addresses)


def _attachments(email: OutgoingEmail) -> list[dict[str, str]]:
    parts = []
    for attachment in email.attachments:
        part = {
            "Name": attachment.filename,
            "Content": base64.b64encode(attachment.content).decode("ascii"),
            "ContentType": attachment.content_type,
        }
        if attachment.content_id is not None:
            part["ContentID"] = f"cid:{attachment.content_id}"
        parts.append(part)
    return parts


def message_payload(email: OutgoingEmail, message_stream: str) -> dict[str, Any]:
    """One email as Postmark's `SendEmailRequest` (the body of `/email`, an item of a
    batch). Raises ValueError (UnsupportedFeature) for what Postmark cannot carry."""
    payload: dict[str, Any] = {
        "From": sender(PROVIDER, email.from_email, email.from_name),
        "To": _mailboxes(email.recipients.to),
    }
    # Each only when the email has one (Bcc: Postmark's own field, envelope only, never a
    # header); the empty ones are not even joined.
    for field, addresses in (
        ("Cc", email.recipients.cc),
        ("Bcc", email.recipients.bcc),
        ("ReplyTo", email.reply_to),
    ):
        if addresses:
            payload[field] = _mailboxes(addresses)
    payload["Subject"] = email.subject
    add_nonempty(payload, ("HtmlBody", email.html), ("TextBody", email.text))
    our_id = str(email.message_id)
    headers = custom_headers(email, {MESSAGE_ID_HEADER: our_id, "Message-ID": email.rfc_message_id})
    payload["Headers"] = [{"Name": name, "Value": value} for name, value in headers.items()]
    if email.attachments:
        payload["Attachments"] = _attachments(email)
    if email.tags:
        payload["Tag"] = email.tags[0]  # Postmark takes one (see the module doc)
    payload["Metadata"] = {METADATA_KEY: our_id}
    payload["MessageStream"] = message_stream
    return payload


def _calls(payloads: Sequence[tuple[int, dict[str, Any]]]) -> Iterator[tuple[list[int], bytes]]:
    """Built payloads cut into calls within Postmark's limits, 500 messages and 50 MB a
    call: each call's indexes and its body (one message: its object; several: their
    list). Each 500 are written at once (an orjson call costs about 1 µs beyond its
    bytes, as much as a small payload's) and are a call when within 50 MB; from the first
    500 that are not, each payload is written alone and the calls are cut by size
    (`_sized_calls`), so the cut is the same as if every payload had been written alone."""
    for start in range(0, len(payloads), MAX_BATCH):
        chunk = payloads[start : start + MAX_BATCH]
        if len(chunk) == 1:
            yield [chunk[0][0]], encode_json(chunk[0][1])
            continue
        body = encode_json([payload for _, payload in chunk])
        if len(body) + 1 <= MAX_BATCH_BYTES:  # as `_sized_calls` counts: a comma after each
            yield [index for index, _ in chunk], body
            continue
        yield from _sized_calls([(index, encode_json(p)) for index, p in payloads[start:]])
        return


def _sized_calls(bodies: Sequence[tuple[int, bytes]]) -> Iterator[tuple[list[int], bytes]]:
    """Written payloads cut into calls by count and size (the JSON array's brackets and
    commas counted), each call's body the bodies joined: the bytes encode_json writes for
    their list."""
    call: list[tuple[int, bytes]] = []
    size = 2
    for index, body in bodies:
        if call and (len(call) == MAX_BATCH or size + len(body) + 1 > MAX_BATCH_BYTES):
            yield _joined(call)
            call, size = [], 2
        call.append((index, body))
        size += len(body) + 1
    if call:
        yield _joined(call)


def _joined(call: Sequence[tuple[int, bytes]]) -> tuple[list[int], bytes]:
    if len(call) == 1:
        return [call[0][0]], call[0][1]
    return [index for index, _ in call], b"[" + b",".join(body for _, body in call) + b"]"


def _error_code(body: Any) -> int | None:
    code = body.get("ErrorCode") if isinstance(body, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _error_text(status: int, body: Any) -> str:
    if isinstance(body, dict) and ("ErrorCode" in body or "Message" in body):
        return (
            f"Postmark HTTP {status} ErrorCode {body.get('ErrorCode')}: {body.get('Message', '')}"
        )
    return f"Postmark HTTP {status}" + (f": {body!r}" if body else "")


class PostmarkProvider(http_api.ApiProvider):
    name = PROVIDER
    max_batch_size = MAX_BATCH
    idempotency_window: timedelta | None = None  # Postmark has no idempotency key
    # Refused at enqueue (services.intake), not only at send time.
    # Addresses go as ASCII strings.
    capabilities = Capabilities(
        utf8_local_part=False, required_settings=("api_key",), spf="include:spf.mtasv.net"
    )

    default_base_url = "https://api.postmarkapp.com"

    def __init__(self, *, message_stream: str = "outbound", **api: Any) -> None:
        super().__init__(**api)
        self.message_stream = message_stream

    @classmethod
    def settings_for(cls, settings: Settings) -> dict[str, Any]:
        return {
            **super().settings_for(settings),
            "message_stream": settings.postmark_message_stream,
        }

    # --- sending -----------------------------------------------------------------------

    async def send(self, email: OutgoingEmail) -> delivery.SendOutcome:
        if self._api_key is None:
            return self.missing_key
        try:
            payload = message_payload(email, self.message_stream)
        except ValueError as exc:  # nothing Postmark could take: an address it cannot carry
            return delivery.Rejected(f"cannot build the Postmark request: {exc}")
        answer = await self._post(SEND_PATH, encode_json(payload))
        return self._outcomes(answer, count=1)[0]

    async def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[delivery.SendOutcome]:
        """One outcome per email, in order: every email Postmark can carry goes in batch
        calls of up to 500 (and 50 MB), concurrently; one it cannot is Rejected alone."""
        if self._api_key is None:
            return [self.missing_key] * len(emails)
        built: list[tuple[int, dict[str, Any]]] = []
        refused: list[tuple[list[int], Any]] = []
        for index, email in enumerate(emails):
            try:
                built.append((index, message_payload(email, self.message_stream)))
            except ValueError as exc:
                refused.append(([index], _refused(f"cannot build the Postmark request: {exc}")))
        calls = [(chunk, self._send_call(chunk, body)) for chunk, body in _calls(built)]
        return await http_api.in_order(len(emails), [*calls, *refused])

    async def _send_call(self, indexes: Sequence[int], body: bytes) -> list[delivery.SendOutcome]:
        if len(indexes) == 1:
            return self._outcomes(await self._post(SEND_PATH, body), count=1)
        return self._outcomes(await self._post(BATCH_PATH, body), count=len(indexes))

    async def _post(self, path: str, body: bytes) -> Answer:
        assert self._api_key is not None
        return await http_api.call(
            self._client, "POST", path, headers={TOKEN_HEADER: self._api_key}, encoded=body
        )

    def _outcomes(self, answer: Answer, *, count: int) -> list[delivery.SendOutcome]:
        """Apply the tables: `count` emails were in the request, in order; a batch's 200
        has one result per email."""
        failed = http_api.no_answer(answer, "Postmark")
        if failed is not None:
            return [self._failure(*failed, answer)] * count
        assert answer.status is not None
        results = answer.body if count > 1 and answer.status == 200 else [answer.body] * count
        if not isinstance(results, list) or len(results) != count:
            text = (
                f"Postmark answered {answer.status} without one result per email: {answer.body!r}"
            )
            return [self._failure(delivery.Ambiguous, text, answer)] * count
        by_status = kit.first_match(RESPONSE_TABLE, status=answer.status)  # once, not per item
        return [self._result(answer, by_status, result) for result in results]

    def _result(self, answer: Answer, by_status: OutcomeClass, result: Any) -> delivery.SendOutcome:
        """One email's outcome from its result (the whole answer's, or a batch's item) and
        what RESPONSE_TABLE says of the answer's status."""
        assert answer.status is not None
        found, code = by_status, _error_code(result)
        if found in (delivery.Accepted, delivery.Rejected) and code:
            found = ERROR_CODES.get(code, delivery.Rejected)
        if found is delivery.Accepted:
            message_id = result.get("MessageID") if isinstance(result, dict) else None
            # No ErrorCode at all: Postmark's "accepted, but delivery may be delayed".
            if code in (0, None) and isinstance(message_id, str) and message_id:
                note = result.get("Message")
                # "Message OK, but will not deliver to these inactive addresses: ..."
                partial = isinstance(note, str) and "inactive" in note.lower()
                return delivery.Accepted(
                    message_id, detail=kit.scrub(note, self._api_key) if partial else None
                )
            text = f"Postmark answered {answer.status} without a MessageID: {result!r}"
            return self._failure(delivery.Ambiguous, text, answer)
        return self._failure(found, _error_text(answer.status, result), answer)

    def _failure(self, found: OutcomeClass, text: str, answer: Answer) -> delivery.SendOutcome:
        hint = kit.retry_after(answer.headers) if answer.headers else None
        # Not keyed: Postmark has no idempotency key, so no resend is deduplicated.
        return kit.failure_outcome(
            found, kit.scrub(text, self._api_key), keyed=False, retry_after=hint
        )

    # --- reading back ------------------------------------------------------------------

    async def find_sent(self, message: Message, rfc_message_id: str) -> list[Sighting]:
        """Postmark's records of our message: the Messages API searched by recipient and
        our Metadata (`metadata_mailbag_message_id=`). A record is a send Postmark took;
        whose it is comes from the record's own Metadata. Raises PostmarkLookupError when
        Postmark cannot say."""
        if self._api_key is None:
            raise PostmarkLookupError("POSTMARK_API_KEY is not set")
        query: dict[str, str | int] = {
            "count": SEARCH_PAGE,
            "offset": 0,
            "recipient": ascii_address(message.to_address),
            f"metadata_{METADATA_KEY}": str(message.id),
        }
        answer = await http_api.call(
            self._client, "GET", SEARCH_PATH, headers={TOKEN_HEADER: self._api_key}, params=query
        )
        failed = http_api.no_answer(answer, "Postmark lookup")
        if failed is not None:
            raise PostmarkLookupError(kit.scrub(failed[1], self._api_key))
        records = answer.body.get("Messages") if isinstance(answer.body, dict) else None
        if answer.status != 200 or not isinstance(records, list):
            assert answer.status is not None
            text = kit.scrub(f"lookup: {_error_text(answer.status, answer.body)}", self._api_key)
            raise PostmarkLookupError(text, status=answer.status)
        return [sighting for record in records if (sighting := _sighting(record)) is not None]


async def _refused(error: str) -> list[delivery.SendOutcome]:
    return [delivery.Rejected(error)]


def _sighting(record: object) -> Sighting | None:
    """What one record of the Messages API proves: Postmark's MessageID, whose message it
    is by our Metadata (Postmark's MessageID is a UUID of its own, never ours), and its
    first recipient."""
    if not isinstance(record, Mapping):
        return None
    provider_id = record.get("MessageID")
    if not isinstance(provider_id, str) or not provider_id:
        return None
    metadata = record.get("Metadata")
    ours = metadata.get(METADATA_KEY) if isinstance(metadata, Mapping) else None
    try:
        message_id = uuid.UUID(ours) if isinstance(ours, str) else None
    except ValueError:
        message_id = None
    return http_api.sighting(provider_id, message_id, record.get("Recipients"))


register(PROVIDER)(PostmarkProvider.from_settings)
