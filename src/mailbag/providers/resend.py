"""`resend`: Resend's email API (resend.com/docs/api-reference).

One email is `POST /emails`; up to 100 share one `POST /emails/batch`. Both authenticate
with `Authorization: Bearer` (RESEND_API_KEY). Every answer is classified by
`RESPONSE_TABLE`, Resend's error `name` first and then its HTTP status; a request that got
no answer by `http_api.TRANSPORT_TABLE`.

Idempotency: a single send carries the attempt's key (`OutgoingEmail.idempotency_key`,
the same on a resend of the same attempt) as `Idempotency-Key`. Resend "checks if an email
with the same idempotency key has already been sent in the last 24 hours" and answers a
repeat with the first response without sending again (resend.com/docs/dashboard/emails/
idempotency-keys; the changelog "Batch Idempotency Keys": "We keep idempotency keys in our
system for 24 hours"), so an ambiguous single send is retried under its key for up to that
window (`IDEMPOTENCY_WINDOW`). A batch call carries no per-email key: its ambiguous
outcomes are never resent.

What a message carries: `from`, `to`, `cc`, `bcc` (envelope only), `reply_to` (`Name
<address>` strings), `subject`, `html`, `text`, `headers` (the caller's,
List-Unsubscribe(-Post), our Message-ID and X-Mailbag-Message-ID), `attachments` (base64
`content`, `filename`, `content_type`, and `content_id` for an inline image: the HTML's
`cid:<content id>` stays as it is) and `tags`: `mailbag_message_id` naming our message
(webhooks echo tags), and each of the message's tags as a tag named after it. Resend's tag
names and values take only ASCII letters, digits, `_` and `-` (at most 256): a tag is sent
with every other character as `_`; the message keeps its tags as they are.

Batches: Resend's batch endpoint takes no attachments ("We currently do not support
sending attachments (including inline images) when using our batch endpoint"), so a
message with attachments is sent by itself, by the single call (keyed), inside the same
`send_batch`; the others go in batch calls of up to 100. A batch refused as a whole (400
or 422: Resend validates the whole batch and sends none) is sent again one by one, keyed,
so only the bad email fails.
"""

from __future__ import annotations

import base64
import functools
import re
import time
import uuid
from collections.abc import Awaitable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from mailbag.compose import MESSAGE_ID_HEADER, OutgoingEmail, message_id_from_rfc
from mailbag.domain import delivery
from mailbag.domain.content import Address
from mailbag.providers import http_api, kit, register
from mailbag.providers.base import Capabilities, Sighting
from mailbag.providers.http_api import Answer, add_nonempty, custom_headers, mailbox, sender
from mailbag.providers.kit import OutcomeTable
from mailbag.providers.resend_events import TAG_NAME  # webhooks echo our message id

if TYPE_CHECKING:
    from mailbag.domain.message import Message

PROVIDER: Final = "resend"
SEND_PATH: Final = "/emails"
BATCH_PATH: Final = "/emails/batch"
MAX_BATCH: Final = 100
IDEMPOTENCY_WINDOW: Final = timedelta(hours=24)  # see the module doc for the source
LIST_PAGE: Final = 100  # `GET /emails` takes at most 100 a page
LIST_MAX_PAGES: Final = 10  # the newest 1,000 emails: an unknown message is a recent one
RECENT_TTL: Final = 30.0  # seconds the list is reused (less than a reconciliation interval)
# `last_event`s after which Resend did not send the email (the rest prove it took it).
NOT_SENT: Final = frozenset({"failed", "suppressed", "canceled", "scheduled"})
TAG_MAX: Final = 256
_NOT_TAG_TEXT: Final = re.compile(r"[^A-Za-z0-9_-]")

RESPONSE_TABLE: Final[OutcomeTable] = (
    # Resend's error `name` first (the same name can come with several statuses), then
    # the status. A status in no row is Ambiguous.
    (range(200, 300), delivery.Accepted),  # with an id (or one per email); without: Ambiguous
    # The key, missing or wrong: nothing can be sent until an operator fixes it.
    ("missing_api_key", delivery.Disabled),
    ("invalid_api_key", delivery.Disabled),
    ("restricted_api_key", delivery.Disabled),
    ("suspended_api_key", delivery.Disabled),
    ("invalid_permission", delivery.Disabled),
    (401, delivery.Disabled),  # a sending endpoint's "API key is invalid"
    # A request with this key is still being processed: it may be sent. Retrying under
    # the same key later gets its answer (keyed, while the window lasts).
    ("concurrent_idempotent_requests", delivery.Ambiguous),
    # This key came before with another body: that earlier request reached Resend, and
    # whether it was sent needs reconciliation (Ambiguous, unkeyed: see `_outcomes`).
    ("invalid_idempotent_request", delivery.Ambiguous),
    (range(300, 400), delivery.Deferred),  # a redirect: not processed (check RESEND_BASE_URL)
    (408, delivery.Deferred),  # request timeout: not processed
    # Its rate limit, or the account's daily or monthly quota: refused before taking
    # anything, not the email's fault, so no attempt is spent.
    (429, delivery.Throttled),
    # 400 validation_error / invalid_idempotency_key, 403 validation_error (an unverified
    # domain, a test-only account), 404, 405, 422 (invalid_attachment, missing_required_field,
    # ...): the same request will be refused again.
    (range(400, 500), delivery.Rejected),
    # 500 application_error, 503 service_unavailable: Resend did not take it.
    (range(500, 600), delivery.Deferred),
)
"""How an HTTP answer from `POST /emails` or `/emails/batch` becomes an outcome. A
Deferred or Throttled carries Retry-After; error texts carry the status and Resend's
`name` and `message`, never the API key."""

# Whole-batch refusals: Resend validates every email of a batch and sends none of them.
_BATCH_REFUSED: Final = frozenset({400, 422})


@functools.lru_cache(maxsize=1024)  # a few tags, on every email
def tag_text(value: str) -> str:
    """A tag name or value as Resend takes it: ASCII letters, digits, `_` and `-` only
    (anything else becomes `_`), at most 256 characters."""
    return _NOT_TAG_TEXT.sub("_", value)[:TAG_MAX] or "_"


def _mailboxes(addresses: Sequence[Address]) -> list[str]:
    return [mailbox(PROVIDER, a.address, a.name) for a in addresses] if addresses else []


def message_payload(email: OutgoingEmail) -> dict[str, Any]:
    """One email as Resend's `SendEmailRequest` (the body of `/emails`, an item of a
    batch). Raises ValueError (UnsupportedFeature) for what Resend cannot carry."""
    cc, bcc = _mailboxes(email.recipients.cc), _mailboxes(email.recipients.bcc)
    reply_to = _mailboxes(email.reply_to)
    payload: dict[str, Any] = {
        "from": sender(PROVIDER, email.from_email, email.from_name),
        "to": _mailboxes(email.recipients.to),
        "subject": email.subject,
    }
    # bcc is Resend's own field: envelope only, never a header.
    add_nonempty(
        payload,
        ("cc", cc),
        ("bcc", bcc),
        ("reply_to", reply_to),
        ("html", email.html),
        ("text", email.text),
    )
    our_id = str(email.message_id)
    payload["headers"] = custom_headers(
        email, {MESSAGE_ID_HEADER: our_id, "Message-ID": email.rfc_message_id}
    )
    if email.attachments:
        payload["attachments"] = [
            {
                "content": base64.b64encode(a.content).decode("ascii"),
                "filename": a.filename,
                "content_type": a.content_type,
                **({"content_id": a.content_id} if a.content_id is not None else {}),
            }
            for a in email.attachments
        ]
    tags = {tag_text(tag): "true" for tag in email.tags}
    tags[TAG_NAME] = our_id  # ours last: a tag of that name cannot hide it
    payload["tags"] = [{"name": name, "value": value} for name, value in tags.items()]
    return payload


def _error_name(body: Any) -> str | None:
    name = body.get("name") if isinstance(body, dict) else None
    return name if isinstance(name, str) else None


def _error_text(status: int, body: Any) -> str:
    if isinstance(body, dict) and ("name" in body or "message" in body):
        return f"Resend HTTP {status} {body.get('name', '')}: {body.get('message', '')}"
    return f"Resend HTTP {status}" + (f": {body!r}" if body else "")


def _ids(body: Any, count: int) -> list[str] | None:
    """The ids a 2xx carries, one per email in order; None when they are not all there."""
    if not isinstance(body, dict):
        return None
    if count == 1 and isinstance(body.get("id"), str) and body["id"]:
        return [body["id"]]
    data = body.get("data")
    if not isinstance(data, list) or len(data) != count:
        return None
    ids = [item.get("id") if isinstance(item, dict) else None for item in data]
    found = [i for i in ids if isinstance(i, str) and i]
    return found if len(found) == count else None


class ResendLookupError(RuntimeError):
    """`GET /emails/{id}` failed: no answer, or an answer that is not an email."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ResendProvider(http_api.ApiProvider):
    name = PROVIDER
    max_batch_size = MAX_BATCH
    idempotency_window: timedelta | None = IDEMPOTENCY_WINDOW
    # Refused at enqueue (services.intake), not only at send time.
    # Addresses go as ASCII strings.
    capabilities = Capabilities(
        utf8_local_part=False, required_settings=("api_key",), spf="include:amazonses.com"
    )

    default_base_url = "https://api.resend.com"

    def __init__(self, **api: Any) -> None:
        super().__init__(**api)
        self._recent: tuple[float, list[dict[str, Any]]] | None = None  # (read at, emails)

    # --- sending -----------------------------------------------------------------------

    async def send(self, email: OutgoingEmail) -> delivery.SendOutcome:
        if self._api_key is None:
            return self.missing_key
        try:
            payload = message_payload(email)
        except ValueError as exc:  # nothing Resend could take: an address it cannot carry
            return delivery.Rejected(f"cannot build the Resend request: {exc}")
        answer = await self._post(SEND_PATH, payload, key=email.idempotency_key)
        return self._outcomes(answer, count=1, keyed=True)[0]

    async def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[delivery.SendOutcome]:
        """One outcome per email, in order: those without attachments in batch calls of up
        to 100, each other one by itself (keyed); the calls run concurrently."""
        if self._api_key is None:
            return [self.missing_key] * len(emails)
        alone = [i for i, email in enumerate(emails) if email.attachments]
        batchable = [i for i, email in enumerate(emails) if not email.attachments]
        calls: list[tuple[Sequence[int], Awaitable[list[delivery.SendOutcome]]]] = [
            ([i], self._send_each([emails[i]])) for i in alone
        ]
        for start in range(0, len(batchable), MAX_BATCH):
            chunk = batchable[start : start + MAX_BATCH]
            calls.append((chunk, self._send_call([emails[i] for i in chunk])))
        return await http_api.in_order(len(emails), calls)

    async def _send_each(self, emails: Sequence[OutgoingEmail]) -> list[delivery.SendOutcome]:
        return [await self.send(email) for email in emails]

    async def _send_call(self, emails: Sequence[OutgoingEmail]) -> list[delivery.SendOutcome]:
        if len(emails) == 1:  # a single send carries a key: strictly safer
            return [await self.send(emails[0])]
        try:
            payloads = [message_payload(email) for email in emails]
        except ValueError:  # one email Resend cannot carry: send each alone, only it fails
            return await self._send_each(emails)
        answer = await self._post(BATCH_PATH, payloads, key=None)
        if answer.status in _BATCH_REFUSED:  # nothing was sent: find the bad one alone
            return await self._send_each(emails)
        return self._outcomes(answer, count=len(emails), keyed=False)

    async def _post(
        self, path: str, payload: dict[str, Any] | list[Any], *, key: str | None
    ) -> Answer:
        assert self._api_key is not None
        headers = {"authorization": f"Bearer {self._api_key}"}
        if key is not None:
            headers["idempotency-key"] = key
        return await http_api.call(self._client, "POST", path, headers=headers, json=payload)

    def _outcomes(self, answer: Answer, *, count: int, keyed: bool) -> list[delivery.SendOutcome]:
        """Apply the tables: `count` emails were in the request, in order."""
        failed = http_api.no_answer(answer, "Resend")
        if failed is not None:
            found, text = failed
        else:
            assert answer.status is not None
            found = kit.first_match(
                RESPONSE_TABLE, code=_error_name(answer.body), status=answer.status
            )
            if found is delivery.Accepted:
                ids = _ids(answer.body, count)
                if ids is not None:
                    return [delivery.Accepted(message_id) for message_id in ids]
                found = delivery.Ambiguous
                text = f"Resend answered {answer.status} without usable ids: {answer.body!r}"
            else:
                text = _error_text(answer.status, answer.body)
        if _error_name(answer.body) == "invalid_idempotent_request":
            keyed = False  # resending under this key can only be refused again
        hint = kit.retry_after(answer.headers) if answer.headers else None
        text = kit.scrub(text, self._api_key)
        return [kit.failure_outcome(found, text, keyed=keyed, retry_after=hint)] * count

    # --- reading back ------------------------------------------------------------------

    async def lookup(self, email_id: str) -> dict[str, Any] | None:
        """Resend's record of one email (`GET /emails/{id}`): `id`, `to`, `message_id`,
        `last_event` (queued, sent, delivered, bounced, ...); None when Resend has no such
        email. Raises ResendLookupError when it cannot say."""
        return await self._get(f"{SEND_PATH}/{email_id}", {})

    async def recent(self, *, pages: int = LIST_MAX_PAGES) -> list[dict[str, Any]]:
        """Resend's most recent emails (`GET /emails`, newest first), at most `pages` of
        100, read once per RECENT_TTL: a reconciliation run looks for many messages, and
        lookups share Resend's rate limit with sends. Raises ResendLookupError when the
        list cannot be had."""
        now = time.monotonic()
        if self._recent is not None and now - self._recent[0] < RECENT_TTL:
            return self._recent[1]
        found: list[dict[str, Any]] = []
        query: dict[str, str | int] = {"limit": LIST_PAGE}
        for _ in range(pages):
            body = await self._get(SEND_PATH, query)
            records = body.get("data") if body is not None else None
            if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
                raise ResendLookupError(
                    kit.scrub(f"lookup: unexpected answer: {body!r}", self._api_key)
                )
            found.extend(records)
            if not records or not body or not body.get("has_more"):
                break
            query = {"limit": LIST_PAGE, "after": str(records[-1].get("id", ""))}
        self._recent = (now, found)
        return found

    async def find_sent(self, message: Message, rfc_message_id: str) -> list[Sighting]:
        """Resend's records that may be of this message, each saying whose it is. By the
        id Resend gave it where a send got one; else among Resend's recent emails by our
        Message-ID (Resend lists no tags; its `message_id` is the Message-ID header, ours
        where Resend kept it). A record whose `last_event` says Resend did not send it
        (failed, suppressed, canceled, scheduled) is no sighting. Raises
        ResendLookupError when Resend cannot say."""
        if message.provider_message_id:
            record = await self.lookup(message.provider_message_id)
            records = [] if record is None else [record]
        else:
            records = [r for r in await self.recent() if r.get("message_id") == rfc_message_id]
        return [
            sighting
            for record in records
            if record.get("last_event") not in NOT_SENT
            and (sighting := _sighting(record, message)) is not None
        ]

    async def _get(self, path: str, query: dict[str, str | int]) -> dict[str, Any] | None:
        if self._api_key is None:
            raise ResendLookupError("RESEND_API_KEY is not set")
        answer = await http_api.call(
            self._client,
            "GET",
            path,
            headers={"authorization": f"Bearer {self._api_key}"},
            params=query or None,
        )
        failed = http_api.no_answer(answer, "Resend lookup")
        if failed is not None:
            raise ResendLookupError(kit.scrub(failed[1], self._api_key))
        assert answer.status is not None
        if answer.status == 404:
            return None
        if answer.status != 200 or not isinstance(answer.body, dict):
            text = kit.scrub(f"lookup: {_error_text(answer.status, answer.body)}", self._api_key)
            raise ResendLookupError(text, status=answer.status)
        return answer.body


def _sighting(record: dict[str, Any], message: Message) -> Sighting | None:
    """What one of Resend's records proves: Resend's id, whose message it is (the id our
    own send recorded for this message, or our Message-ID in the record), its first
    recipient."""
    provider_id = record.get("id")
    if not isinstance(provider_id, str) or not provider_id:
        return None
    if provider_id == message.provider_message_id:
        ours: uuid.UUID | None = message.id
    else:
        header = record.get("message_id")
        ours = message_id_from_rfc(header) if isinstance(header, str) else None
    return http_api.sighting(provider_id, ours, record.get("to"))


register(PROVIDER)(ResendProvider.from_settings)
