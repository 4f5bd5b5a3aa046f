"""`sendgrid`: Twilio SendGrid's v3 Mail Send API, `POST /v3/mail/send`.

One email is one request with one personalization (its To, Cc and Bcc, and `custom_args`
naming our message and tenant, so SendGrid's events can be matched back). SendGrid answers
202 with no body and the message's id in the `X-Message-Id` header; its events carry that
id as the first part of `sg_message_id`. Every answer is classified by `RESPONSE_TABLE`,
every failure without one by `http_api.TRANSPORT_TABLE`.

Batches: none (`max_batch_size` 1). `/v3/mail/batch` only creates a batch *id* that groups
scheduled sends so they can be paused or cancelled together; it sends nothing. Several
personalizations in one request do reach several envelopes, but they share the request's
content, attachments, Reply-To and headers (a personalization may override its subject,
headers and substitutions, never its body), and mailbag's messages each have a body of
their own. So each email is its own request, sent one after the other (`SendOneByOne`).

Idempotency: none. SendGrid has no idempotency key (its published OpenAPI defines no such
header, and its API reference names none), so `idempotency_window` is None and an
ambiguous send stays `unknown` until an event settles it.

What a message carries, field by field: `from`, the personalization's `to`, `cc` and `bcc`
(Bcc is envelope only), `reply_to` (one) or `reply_to_list` (several), `subject`,
`content` (text/plain first, then text/html, as SendGrid requires), `attachments` (base64
`content`, `type`, `filename`, and for an inline image `disposition: inline` with its
`content_id`), `headers` (the caller's, List-Unsubscribe(-Post), our Message-ID and
X-Mailbag-Message-ID) and `categories` (mailbag's tags: SendGrid takes at most 10, so the
first 10 go; all of them stay mailbag's). What SendGrid cannot carry is refused
(`kit.unsupported_feature`, so the send is Rejected with the reason): a custom header it
forbids (Reply-To, Received, DKIM-Signature, X-SG-ID, X-SG-EID: its API reference lists
them), and a non-ASCII local part (its schema's `format: email`; enqueue refuses it first,
by `capabilities`).

Reconciliation: SendGrid's message search (the Email Activity API) is a paid add-on
("Extended email activity history"), so this provider has no lookup; an `unknown` send is
settled by SendGrid's events (sendgrid_events.py) or by an operator.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import timedelta
from email.utils import quote
from typing import Any, Final

from mailbag.compose import MESSAGE_ID_HEADER, OutgoingEmail
from mailbag.domain import delivery
from mailbag.domain.content import Address
from mailbag.providers import http_api, kit, register
from mailbag.providers.base import Capabilities, SendOneByOne
from mailbag.providers.http_api import Answer
from mailbag.providers.sendgrid_events import MESSAGE_ID_ARG, TENANT_ID_ARG

SEND_PATH: Final = "/v3/mail/send"
MAX_CATEGORIES: Final = 10  # the spec's `categories.maxItems`
MESSAGE_ID_RESPONSE_HEADER: Final = "x-message-id"
# The code `send` gives an error answer whose errors name the `from` field.
FROM_REFUSED: Final = "field:from"
# Headers SendGrid's `headers` may not set (its OpenAPI's description of the field), less
# those mailbag never sends as custom headers anyway (To, From, Subject, Cc, Bcc,
# Content-Type, Content-Transfer-Encoding: enqueue refuses them).
FORBIDDEN_HEADERS: Final = frozenset(
    {"x-sg-id", "x-sg-eid", "received", "dkim-signature", "reply-to"}
)
# SendGrid misquotes a personalization's display name holding a comma or a semicolon
# (sendgrid/sendgrid-python#291; django-anymail works around it the same way): such a name
# goes quoted, so it reaches the header as one name.
_NAME_NEEDS_QUOTES: Final = frozenset(",;")

RESPONSE_TABLE: Final[kit.OutcomeTable] = (
    # The first row whose status matches wins; a status in no row is Ambiguous.
    (202, delivery.Accepted),  # with an X-Message-Id; without one: Ambiguous
    (range(200, 300), delivery.Ambiguous),  # another 2xx: success of some kind, but no id
    (range(300, 400), delivery.Deferred),  # a redirect: not processed (check SENDGRID_BASE_URL)
    # The API key is wrong or revoked (401), or lacks the mail.send permission, or the
    # account cannot send (403): no message can go until an operator acts, so none spends
    # an attempt.
    (401, delivery.Disabled),
    (408, delivery.Deferred),  # request timeout: SendGrid gave up before processing
    (429, delivery.Throttled),  # rate limited before taking it: no attempt spent
    (range(500, 600), delivery.Deferred),  # SendGrid answered with an error: it did not take it
    # A refusal naming the message's own `from` (a 403: a sender identity SendGrid has not
    # verified) is about this message, not the account: Rejected, even as a 403.
    (FROM_REFUSED, delivery.Rejected),
    (403, delivery.Disabled),
    (range(400, 500), delivery.Rejected),  # 400, 404, 413 (too large), ...: refused again
)
"""How an HTTP answer from `POST /v3/mail/send` becomes an outcome. A Throttled or Deferred
carries Retry-After as its retry_after (SendGrid's X-RateLimit-Reset is a Unix time, not a
delay, so it is not read); error texts carry the status and SendGrid's `errors`, never the
API key."""


def _address(address: str, name: str | None) -> dict[str, str]:
    """A SendGrid address object: the domain in its ASCII (IDNA) form, as its schema's
    `format: email` wants; a non-ASCII local part it cannot carry."""
    email = kit.ascii_envelope_address("sendgrid", address)
    return {"email": email, "name": name} if name else {"email": email}


def _personalization_address(address: Address) -> dict[str, str]:
    if address.name and _NAME_NEEDS_QUOTES & set(address.name):
        return _address(address.address, f'"{quote(address.name)}"')
    return _address(address.address, address.name)


def _envelope(email: OutgoingEmail) -> dict[str, Any]:
    """The one personalization: To, Cc and Bcc, each address once (SendGrid refuses an
    address named twice in a personalization, and delivers each once anyway), and our ids."""
    seen: set[str] = set()
    envelope: dict[str, Any] = {}
    for field, addresses in (
        ("to", email.recipients.to),
        ("cc", email.recipients.cc),
        ("bcc", email.recipients.bcc),  # SendGrid's own field: envelope only, never a header
    ):
        kept = []
        for address in addresses:
            key = address.address.casefold()
            if key not in seen:
                seen.add(key)
                kept.append(_personalization_address(address))
        if kept:
            envelope[field] = kept
    envelope["custom_args"] = {
        MESSAGE_ID_ARG: str(email.message_id),
        TENANT_ID_ARG: email.tenant_id,
    }
    return envelope


def _content(email: OutgoingEmail) -> list[dict[str, str]]:
    """text/plain first, then text/html, each only when there is one (`value` has
    minLength 1)."""
    parts = [("text/plain", email.text), ("text/html", email.html)]
    return [{"type": kind, "value": value} for kind, value in parts if value]


def _attachments(email: OutgoingEmail) -> list[dict[str, str]]:
    parts = []
    for attachment in email.attachments:
        part = {
            "content": base64.b64encode(attachment.content).decode("ascii"),
            "type": attachment.content_type,
            "filename": attachment.filename,
            "disposition": "inline" if attachment.inline else "attachment",
        }
        if attachment.content_id is not None:
            part["content_id"] = attachment.content_id  # the HTML's cid: reference
        parts.append(part)
    return parts


def _headers(email: OutgoingEmail) -> dict[str, str]:
    for name in email.headers:
        if name.lower() in FORBIDDEN_HEADERS:
            feature = f"a {name} header (its API does not let a request set it"
            if name.lower() == "reply-to":
                feature += "; give reply_to instead"
            kit.unsupported_feature("sendgrid", feature + ")")
    return http_api.custom_headers(
        email, {"Message-ID": email.rfc_message_id, MESSAGE_ID_HEADER: str(email.message_id)}
    )


def payload(email: OutgoingEmail) -> dict[str, Any]:
    """The body of `POST /v3/mail/send` for one email."""
    body: dict[str, Any] = {
        "personalizations": [_envelope(email)],
        "from": _address(email.from_email, email.from_name),
    }
    if len(email.reply_to) == 1:
        body["reply_to"] = _address(email.reply_to[0].address, email.reply_to[0].name)
    elif email.reply_to:
        body["reply_to_list"] = [_address(a.address, a.name) for a in email.reply_to]
    if email.subject:
        body["subject"] = email.subject
    body["content"] = _content(email)
    attachments = _attachments(email)
    if attachments:
        body["attachments"] = attachments
    body["headers"] = _headers(email)
    if email.tags:
        body["categories"] = list(dict.fromkeys(email.tags))[:MAX_CATEGORIES]
    return body


class SendGridProvider(http_api.ApiProvider, SendOneByOne):
    name = "sendgrid"
    default_base_url = "https://api.sendgrid.com"
    max_batch_size = 1  # no call sends distinct messages (see the module doc)
    idempotency_window: timedelta | None = None  # no idempotency key: ambiguous means unknown
    # Refused at enqueue (services.intake), not only at send time.
    # Its schema's `format: email` is ASCII only.
    capabilities = Capabilities(
        utf8_local_part=False, required_settings=("api_key",), spf="include:sendgrid.net"
    )

    async def send(self, email: OutgoingEmail) -> delivery.SendOutcome:
        if self._api_key is None:
            return self.missing_key
        try:
            body = payload(email)
        except ValueError as exc:  # nothing SendGrid could take: an address, a header
            return delivery.Rejected(f"cannot build the SendGrid request: {exc}")
        answer = await http_api.call(
            self._client,
            "POST",
            SEND_PATH,
            headers={"authorization": f"Bearer {self._api_key}"},
            json=body,
        )
        return ANSWERS.unkeyed_outcome(
            answer,
            secret=self._api_key,
            code=FROM_REFUSED if "from" in _error_fields(answer.body) else None,
            retry_after=kit.retry_after(answer.headers) if answer.headers else None,
        )


def _x_message_id(answer: Answer) -> str | None:
    return answer.headers.get(MESSAGE_ID_RESPONSE_HEADER) if answer.headers else None


def _errors(body: Any) -> Sequence[dict[str, Any]]:
    errors = body.get("errors") if isinstance(body, dict) else None
    return [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []


def _error_fields(body: Any) -> set[str]:
    return {e["field"] for e in _errors(body) if isinstance(e.get("field"), str)}


def _error_text(status: int, body: Any) -> str:
    errors = _errors(body)
    if not errors:
        return f"SendGrid HTTP {status}" + (f": {body!r}" if body else "")
    said = "; ".join(
        f"{e.get('message', '')}" + (f" ({e['field']})" if isinstance(e.get("field"), str) else "")
        for e in errors
    )
    return f"SendGrid HTTP {status}: {said}"


ANSWERS: Final = http_api.Answers("SendGrid", RESPONSE_TABLE, _x_message_id, _error_text)

register("sendgrid")(SendGridProvider.from_settings)
