"""`brevo`: Brevo's (ex-Sendinblue) transactional email HTTP API.

One email is `POST /v3/smtp/email` with `to`; several share one call through
`messageVersions` (up to 1000 versions, no outer `to`). Every answer and every transport
failure is classified by the one table below, `RESPONSE_TABLE` (with
`http_api.TRANSPORT_TABLE` for requests that got no answer).

Idempotency: a single send carries `headers.idempotencyKey`, a UUID derived from the email's
own key (message id and attempt), so sending the same email again after an ambiguous
failure sends the same key and Brevo, for 15 minutes, does not process it twice. Brevo
answers such a repeat with a `duplicate_parameter` error rather than the first message id;
that answer says "I already have a request with this key" but not what became of it, so it
is classified Ambiguous (unkeyed: repeating it cannot tell more) and left to reconciliation.
A batch call carries no per-email key, so its ambiguous outcomes are never resent.

What a message carries, field by field: `sender`, `to`, `cc`, `bcc` (Brevo puts Bcc in the
envelope only), `replyTo`, `subject`, `htmlContent`, `textContent`, `headers` (the caller's,
List-Unsubscribe and List-Unsubscribe-Post, ours) and `attachment` (base64 `content` and
`name`). What Brevo's API (v3, `sendSmtpEmail`) cannot carry is refused, never dropped
(`kit.unsupported_feature`, so the send is Rejected with the reason):

- Several Reply-To addresses: `replyTo` is one object, and `headers` is documented for
  custom headers, "not the standard headers".
- An attachment whose name has an extension outside Brevo's documented list
  (`ATTACHMENT_EXTENSIONS`): Brevo would refuse the whole request.

Inline images: the API documents no Content-ID, disposition or content type for an
attachment (Brevo told django-anymail its v3 API has no inline images). The one link its
fields can express is the name, so an inline image goes as an attachment *named after its
`cid:` reference*, and the HTML refers to that name (`cid:logo` becomes `cid:logo.png` when
the content id has no file extension Brevo accepts). Whether Brevo then embeds it is
Brevo's undocumented behaviour; at worst the image arrives as an ordinary attachment, bytes
intact.

Batches (`messageVersions`): a version carries only `to`, `cc`, `bcc`, `replyTo`,
`subject`, `htmlContent`, `textContent` and `params`; sender, headers, tags and
attachments are the call's. So a message goes into a batch only when it has none of its
own attachments, Cc, Bcc or Reply-To (`batchable`; cc/bcc/replyTo could ride in a version,
but such messages are few and a single send carries their idempotency key and Message-Id),
and only with messages sharing everything else (`_batch_group`). Every other message is
sent by itself, by the single call, inside the same `send_batch`.
"""

from __future__ import annotations

import asyncio
import base64
import mimetypes
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, Final

import httpx

from mailbag.compose import MESSAGE_ID_HEADER, OutgoingEmail, message_id_from_rfc
from mailbag.domain import delivery
from mailbag.domain.content import CID_REFERENCE, Address, Attachment
from mailbag.domain.message import Message, ascii_address
from mailbag.providers import http_api, register
from mailbag.providers.base import Capabilities, Sighting
from mailbag.providers.http_api import Answer, custom_headers
from mailbag.providers.http_api import encode_json as encode_json  # its tests read it here
from mailbag.providers.kit import (
    OutcomeTable,
    ascii_envelope_address,
    describe,
    failure_outcome,
    first_match,
    retry_after,
    scrub,
    unsupported_feature,
)

SEND_PATH: Final = "/v3/smtp/email"
LIST_PATH: Final = "/v3/smtp/emails"
MAX_VERSIONS_PER_CALL: Final = 1000
# Brevo's limits on recipients (To, Cc and Bcc): per message version, and per request.
MAX_RECIPIENTS_PER_VERSION: Final = 99
MAX_RECIPIENTS_PER_CALL: Final = 2000
# The attachment file extensions `sendSmtpEmail.attachment` documents; any other is refused.
# fmt: off
ATTACHMENT_EXTENSIONS: Final = frozenset({
    "xlsx", "xls", "ods", "docx", "docm", "doc", "csv", "pdf", "txt", "gif", "jpg", "jpeg",
    "png", "tif", "tiff", "rtf", "bmp", "cgm", "css", "shtml", "html", "htm", "zip", "xml",
    "ppt", "pptx", "tar", "ez", "ics", "mobi", "msg", "pub", "eps", "odt", "mp3", "m4a",
    "m4v", "wma", "ogg", "flac", "wav", "aif", "aifc", "aiff", "mp4", "mov", "avi", "mkv",
    "mpeg", "mpg", "wmv", "pkpass", "xlsm",
})
# fmt: on
# How long Brevo remembers an idempotencyKey. Its sources disagree: the changelog entry that
# introduced the key (developers.brevo.com/changelog, 2021-11-10, "Email API now supports
# idempotency") says "The TTL for the idempotencyKey is 15 minutes"; the later guide
# "Idempotency for batch emails" says 30. A window declared too long could resend after
# Brevo forgot the key (a duplicate); too short only ends in `unknown` sooner. So the
# shorter one.
IDEMPOTENCY_WINDOW: Final = timedelta(minutes=15)
# Brevo requires idempotencyKey to be a UUID; ours is not one, so we send its UUIDv5 under
# this fixed namespace. Never change it: in-flight retries would stop matching.
IDEMPOTENCY_NAMESPACE: Final = uuid.UUID("6f1d3c2a-9a57-4b8e-a0f4-5b1e2d7c9e31")
# Where a Deferred's or Throttled's retry_after comes from, first found first: Brevo's own
# rate limit reset (seconds), else the standard header.
RETRY_AFTER_HEADERS: Final = ("x-sib-ratelimit-reset", "retry-after")
# Brevo's error code for a request whose idempotencyKey it has already seen.
DUPLICATE_KEY_CODES: Final = frozenset({"duplicate_parameter", "duplicate_request"})
LOOKUP_PAGE_SIZE: Final = 1000
LOOKUP_MAX_PAGES: Final = 50

RESPONSE_TABLE: Final[OutcomeTable] = (
    # The first row whose status matches wins; a status in no row is Ambiguous.
    (range(200, 203), delivery.Accepted),  # with a messageId (or messageIds); without: Ambiguous
    (range(203, 300), delivery.Ambiguous),  # another 2xx: success of some kind, but no id
    (range(300, 400), delivery.Deferred),  # a redirect: not processed (check BREVO_BASE_URL)
    (408, delivery.Deferred),  # request timeout: Brevo gave up before processing
    (425, delivery.Deferred),  # too early: not processed
    (429, delivery.Throttled),  # rate limited before taking it: no attempt spent, the fleet slows
    # 400/401/403/422 and the other 4xx: the same request will be refused again. Except a
    # keyed send's duplicate_parameter: Ambiguous, keyed=False (see the module doc).
    (range(400, 500), delivery.Rejected),
    (range(500, 600), delivery.Deferred),  # Brevo answered with an error: it did not take it
)
"""How an HTTP answer from `POST /v3/smtp/email` becomes an outcome. A Deferred or Throttled
carries `RETRY_AFTER_HEADERS` as its retry_after; error texts carry the status and Brevo's `code`
and `message`, never the API key."""


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
    refuses it for this provider: its `capabilities`)."""
    email = ascii_envelope_address("brevo", address)
    return {"email": email, "name": name} if name else {"email": email}


def _addresses(addresses: Sequence[Address]) -> list[dict[str, str]]:
    return [_address(a.address, a.name) for a in addresses]


def _recipient_fields(email: OutgoingEmail) -> dict[str, Any]:
    """`to`, and `cc`, `bcc`, `replyTo` when the email has them: the same keys in a single
    send and in a message version."""
    fields: dict[str, Any] = {"to": _addresses(email.recipients.to)}
    if email.recipients.cc:
        fields["cc"] = _addresses(email.recipients.cc)
    if email.recipients.bcc:  # Brevo's own field: envelope only, never a header
        fields["bcc"] = _addresses(email.recipients.bcc)
    if len(email.reply_to) > 1:
        unsupported_feature(
            "brevo",
            f"{len(email.reply_to)} Reply-To addresses (its replyTo takes one, and its "
            "headers take no standard header)",
        )
    if email.reply_to:
        fields["replyTo"] = _address(email.reply_to[0].address, email.reply_to[0].name)
    return fields


def _body_fields(html: str, text: str) -> dict[str, str]:
    """`htmlContent` and `textContent`, each only when there is one (a ready-made email may
    have text alone)."""
    fields = {"htmlContent": html} if html else {}
    if text:
        fields["textContent"] = text
    return fields


def _extension(name: str) -> str | None:
    """The file extension Brevo would see (lower case), if it is one it accepts."""
    _, dot, extension = name.rpartition(".")
    return extension.lower() if dot and extension.lower() in ATTACHMENT_EXTENSIONS else None


def attachment_name(attachment: Attachment) -> str:
    """The `name` an attachment goes under. An ordinary one: its filename. An inline image:
    its content id, with the filename's (or its type's) extension added when the content
    id has no extension Brevo accepts, so the HTML's `cid:` reference can name it."""
    if attachment.content_id is None:
        if _extension(attachment.filename) is None:
            unsupported_feature(
                "brevo",
                f"an attachment named {attachment.filename!r} (its API takes only the file "
                "extensions it documents: pdf, png, jpg, docx, xlsx, csv, txt, zip, ics, ...)",
            )
        return attachment.filename
    if _extension(attachment.content_id):
        return attachment.content_id
    extension = _extension(attachment.filename) or _extension(
        mimetypes.guess_extension(attachment.content_type) or ""
    )
    if extension is None:
        unsupported_feature(
            "brevo", f"an inline {attachment.content_type} ({attachment.filename!r})"
        )
    return f"{attachment.content_id}.{extension}"


def attachment_fields(email: OutgoingEmail) -> tuple[str, list[dict[str, str]]]:
    """The HTML to send and the `attachment` list: base64 content and name for each, in
    order, inline images named as `attachment_name` says and the HTML's `cid:` references
    to them renamed to match."""
    html = email.html
    parts: list[dict[str, str]] = []
    inline_names: dict[str, str] = {}  # content id -> the attachment name it goes under
    for attachment in email.attachments:
        name = attachment_name(attachment)
        content = base64.b64encode(attachment.content).decode("ascii")
        parts.append({"content": content, "name": name})
        if attachment.content_id is not None:
            inline_names[attachment.content_id] = name
    names = [part["name"] for part in parts]
    for name in inline_names.values():
        if names.count(name) > 1:  # the reference would not tell which one it means
            unsupported_feature("brevo", f"an inline image and another attachment named {name!r}")
    renamed = {cid: name for cid, name in inline_names.items() if cid != name}
    if renamed:
        html = CID_REFERENCE.sub(
            lambda ref: f"cid:{renamed[ref[1]]}" if ref[1] in renamed else ref[0], html
        )
    return html, parts


def single_payload(email: OutgoingEmail) -> dict[str, Any]:
    """The body of a one-email send, carrying this email's ids and idempotency key."""
    html, attachments = attachment_fields(email)
    payload: dict[str, Any] = {
        "sender": _address(email.from_email, email.from_name),
        **_recipient_fields(email),
        "subject": email.subject,
        **_body_fields(html, email.text),
    }
    if attachments:
        payload["attachment"] = attachments
    payload["headers"] = custom_headers(
        email,
        {
            MESSAGE_ID_HEADER: str(email.message_id),
            "Message-Id": email.rfc_message_id,
            "idempotencyKey": brevo_idempotency_key(email),
        },
    )
    # A tag naming our message lets reconciliation find this send in Brevo's records.
    payload["tags"] = [*email.tags, lookup_tag(email.message_id)]
    return payload


def lookup_tag(message_id: uuid.UUID) -> str:
    return f"mailbag-{message_id}"


def batchable(email: OutgoingEmail) -> bool:
    """Whether the email may go as one message version (see the module doc); any other is
    sent by itself."""
    return (
        not email.attachments
        and not email.recipients.cc
        and not email.recipients.bcc
        and not email.reply_to
        and len(email.recipients.to) <= MAX_RECIPIENTS_PER_VERSION
    )


def batch_payload(emails: Sequence[OutgoingEmail]) -> dict[str, Any]:
    """One call for batchable emails that share sender, tags, headers and which bodies they
    have (see `_batch_group`).

    Brevo's message versions carry only recipients, subject and bodies: no headers and no
    tags. So the per-email Message-Id, X-Mailbag-Message-ID and idempotency key cannot
    travel in a batch; the returned message ids, in order, are what ties each email to
    Brevo's record.
    """
    first = emails[0]
    versions = []
    for email in emails:  # per email, so built in place rather than by merging dicts
        version = _recipient_fields(email)
        version["subject"] = email.subject
        if email.html:
            version["htmlContent"] = email.html
        if email.text:
            version["textContent"] = email.text
        versions.append(version)
    # Brevo wants a top-level subject and body when no template is used, and lets a
    # version override a body only of a kind present at the top. Every version carries its
    # own, so the first email's serve; a version never inherits another email's body,
    # because emails share a call only when they have the same kinds of body.
    payload: dict[str, Any] = {
        "sender": _address(first.from_email, first.from_name),
        "subject": first.subject,
        **(_body_fields(first.html, "") or _body_fields("", first.text)),
        "messageVersions": versions,
    }
    headers = custom_headers(first, {})
    if headers:
        payload["headers"] = headers
    if first.tags:
        payload["tags"] = list(first.tags)
    return payload


def _batch_group(email: OutgoingEmail) -> tuple[Any, ...]:
    """What must be equal for batchable emails to share one call: all that is not per
    version, and which bodies they have (see `batch_payload`)."""
    return (
        email.from_email,
        email.from_name,
        tuple(email.tags),
        tuple(sorted(email.headers.items())),
        tuple(sorted(email.list_unsubscribe.items())),
        bool(email.html),
        bool(email.text),
    )


def _calls(emails: Sequence[OutgoingEmail], indexes: Sequence[int]) -> Iterator[list[int]]:
    """`indexes` (one batch group) cut into calls within Brevo's limits: at most 1000
    versions and 2000 recipients a call."""
    call: list[int] = []
    recipients = 0
    for index in indexes:
        count = len(emails[index].recipients.to)
        if call and (
            len(call) == MAX_VERSIONS_PER_CALL or recipients + count > MAX_RECIPIENTS_PER_CALL
        ):
            yield call
            call, recipients = [], 0
        call.append(index)
        recipients += count
    if call:
        yield call


class BrevoProvider(http_api.ApiProvider):
    name = "brevo"
    max_batch_size = MAX_VERSIONS_PER_CALL
    idempotency_window: timedelta | None = IDEMPOTENCY_WINDOW
    # Refused at enqueue (services.intake), not only at send time.
    capabilities = Capabilities(
        utf8_local_part=False,  # its schema's `format: email` is ASCII only
        max_reply_to=1,  # its replyTo is one object
        max_name_length=70,  # "Maximum allowed characters are 70" (to, cc, bcc, replyTo names)
        attachment_extensions=ATTACHMENT_EXTENSIONS,
        required_settings=("api_key",),
        spf="include:spf.brevo.com",
    )

    default_base_url = "https://api.brevo.com"

    # --- sending -----------------------------------------------------------------------

    async def send(self, email: OutgoingEmail) -> delivery.SendOutcome:
        if self._api_key is None:
            return self.missing_key
        try:
            payload = single_payload(email)
        except ValueError as exc:  # nothing Brevo could take: an address it cannot carry
            return delivery.Rejected(f"cannot build the Brevo request: {exc}")
        answer = await self._post(payload)
        return self._outcomes(answer, count=1, keyed=True)[0]

    async def send_batch(self, emails: Sequence[OutgoingEmail]) -> list[delivery.SendOutcome]:
        """One outcome per email, in order. Batchable emails are grouped by what a call
        shares and each group is sent in calls within Brevo's limits; every other email is
        sent by itself (keyed). The calls run concurrently."""
        if self._api_key is None:
            return [self.missing_key] * len(emails)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, email in enumerate(emails):
            # A message a version cannot carry is a group of its own: a single send.
            key = _batch_group(email) if batchable(email) else ("alone", index)
            groups.setdefault(key, []).append(index)
        calls = [call for indexes in groups.values() for call in _calls(emails, indexes)]
        return await http_api.in_order(
            len(emails), [(chunk, self._send_call([emails[i] for i in chunk])) for chunk in calls]
        )

    async def _send_call(self, emails: Sequence[OutgoingEmail]) -> list[delivery.SendOutcome]:
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

    async def _post(self, payload: dict[str, Any]) -> Answer:
        assert self._api_key is not None
        return await http_api.call(
            self._client, "POST", SEND_PATH, headers={"api-key": self._api_key}, json=payload
        )

    def _outcomes(self, answer: Answer, *, count: int, keyed: bool) -> list[delivery.SendOutcome]:
        """Apply the tables: `count` emails were in the request, in order."""
        failed = http_api.no_answer(answer, "Brevo")
        if failed is not None:
            found, text = failed
        else:
            assert answer.status is not None
            status, body = answer.status, answer.body
            found = first_match(RESPONSE_TABLE, status=status)
            if found is delivery.Accepted:
                ids = _message_ids(body, count)
                if ids is not None:
                    return [delivery.Accepted(message_id) for message_id in ids]
                found = delivery.Ambiguous
                text = f"Brevo answered {status} without usable message ids: {body!r}"
            else:
                text = _error_text(status, body)
        text = scrub(text, self._api_key)
        if found is delivery.Rejected and keyed and _error_code(answer.body) in DUPLICATE_KEY_CODES:
            text += (
                " (an earlier request with this idempotency key reached Brevo: whether it "
                "was sent needs reconciliation)"
            )
            return [delivery.Ambiguous(text, keyed=False)] * count
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
