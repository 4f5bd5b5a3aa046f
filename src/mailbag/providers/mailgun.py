"""`mailgun`: Mailgun's Messages API, sending the exact MIME mailbag composes.

One email is `POST /v3/{MAILGUN_DOMAIN}/messages.mime`, multipart/form-data: `message` is
the MIME (`OutgoingEmail.raw`, as SES and SMTP send it, so recipients get our headers,
our Message-ID and our DKIM-able bytes unchanged), `to` is each envelope recipient (To, Cc
and Bcc: Mailgun delivers to `to` and leaves the MIME's headers alone, so Bcc is envelope
only), `v:mailbag-message-id` names our message in every event and in the Events API, and
`o:tag` carries mailbag's tags (Mailgun takes at most 3, ASCII, 128 characters each: the
first three that fit go; all of them stay mailbag's). Mailgun answers 200 `{id, message}`:
the id is the provider message id. Answers are classified by `RESPONSE_TABLE`, failures
without one by `http_api.TRANSPORT_TABLE`.

Mailgun shows `v:` variables and tags to the recipient (X-Mailgun-Variables,
X-Mailgun-Tag), so only our message id goes as a variable (it is in our Message-ID
already); the tenant is not sent.

Batches: none (`max_batch_size` 1). Mailgun's batch sending is one message to up to 1,000
recipients with `recipient-variables` substituted into it, not distinct messages; each of
mailbag's messages has its own MIME (body, Message-ID), so each is its own request.

Idempotency: none. Mailgun has no idempotency key (its published OpenAPI defines none), so
`idempotency_window` is None and an ambiguous send stays `unknown` until an event or the
Events API (`find_sent`) settles it.

Base URLs: `https://api.mailgun.net` (US, the default) or `https://api.eu.mailgun.net`
(a domain in the EU region): MAILGUN_BASE_URL. Auth: HTTP Basic, user `api`, password
the API key.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from email.errors import MessageError
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

from mailbag.compose import OutgoingEmail
from mailbag.domain import delivery
from mailbag.domain.message import Message, ascii_address
from mailbag.providers import http_api, kit, mailgun_events, register
from mailbag.providers.base import Capabilities, SendOneByOne, Sighting
from mailbag.providers.http_api import Answer
from mailbag.providers.mailgun_events import MESSAGE_ID_VARIABLE

if TYPE_CHECKING:
    from mailbag.settings import Settings

SEND_PATH: Final = "/v3/{domain}/messages.mime"
EVENTS_PATH: Final = "/v3/{domain}/events"
MAX_TAGS: Final = 3  # "A single message may be marked with up to 3 tags" (Mailgun's Tags guide)
TAG_MAX: Final = 128  # "... should be ascii only. The maximum length of characters is 128."
# How a 429's text gives its wait when no Retry-After header does (the spec's example:
# "account-requests-per-sec limit exceeded, try again after 120 seconds").
_TRY_AGAIN_AFTER: Final = re.compile(r"try again after (\d{1,6}) seconds?", re.IGNORECASE)
# The Events API: at most 300 records a page (its `limit`); a message has a few per recipient.
EVENTS_PAGE_SIZE: Final = 300
EVENTS_MAX_PAGES: Final = 10
# Looked for from a little before the message was created: clocks differ.
EVENTS_CLOCK_MARGIN: Final = timedelta(minutes=5)

RESPONSE_TABLE: Final[kit.OutcomeTable] = (
    # The first row whose status matches wins; a status in no row is Ambiguous.
    (200, delivery.Accepted),  # with an `id`; without one: Ambiguous
    (range(201, 300), delivery.Ambiguous),  # another 2xx: success of some kind, but no id
    (range(300, 400), delivery.Deferred),  # a redirect: not processed (check MAILGUN_BASE_URL)
    # A wrong key (401 "Forbidden"), an account or domain that may not send (403), or a
    # MAILGUN_DOMAIN the account does not have (404, "Domain not found"; also a domain of
    # the other region): no message can go until an operator acts, none spends an attempt.
    (401, delivery.Disabled),
    (403, delivery.Disabled),
    (404, delivery.Disabled),
    (408, delivery.Deferred),  # request timeout: Mailgun gave up before processing
    (429, delivery.Throttled),  # rate limited before taking it: no attempt spent
    (range(400, 500), delivery.Rejected),  # 400 (a bad address, a bad MIME), 413: refused again
    (range(500, 600), delivery.Deferred),  # Mailgun answered with an error: it did not take it
)
"""How an HTTP answer from `POST /v3/{domain}/messages.mime` becomes an outcome. A Throttled
or Deferred carries Retry-After (or the wait a 429's message names) as its retry_after;
error texts carry the status and Mailgun's `message`, never the API key."""


class MailgunLookupError(RuntimeError):
    """`GET /v3/{domain}/events` failed: no answer, or an answer that is not the list."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def form_fields(email: OutgoingEmail) -> dict[str, str | list[str]]:
    """The form's text fields: each envelope recipient as a `to`, our variable, the tags
    Mailgun can take (a list repeats its field). A non-ASCII local part Mailgun cannot
    carry (enqueue refuses it first: `capabilities`)."""
    fields: dict[str, str | list[str]] = {
        "to": [kit.ascii_envelope_address("mailgun", a) for a in email.envelope_recipients],
        f"v:{MESSAGE_ID_VARIABLE}": str(email.message_id),
    }
    tags = sendable_tags(email.tags)
    if tags:
        fields["o:tag"] = tags
    return fields


def sendable_tags(tags: Sequence[str]) -> list[str]:
    """The first MAX_TAGS of the tags Mailgun accepts (ASCII, at most TAG_MAX characters)."""
    fitting = [tag for tag in dict.fromkeys(tags) if tag.isascii() and len(tag) <= TAG_MAX]
    return fitting[:MAX_TAGS]


class MailgunProvider(http_api.ApiProvider, SendOneByOne):
    name = "mailgun"
    default_base_url = "https://api.mailgun.net"  # EU: https://api.eu.mailgun.net
    max_batch_size = 1  # batch sending is one message to many (see the module doc)
    idempotency_window: timedelta | None = None  # no idempotency key: ambiguous means unknown
    # Refused at enqueue (services.intake): Mailgun documents no SMTPUTF8 for its API.
    capabilities = Capabilities(
        utf8_local_part=False,
        required_settings=("api_key", "domain"),
        spf="include:mailgun.org",
        sends_raw_mime=True,  # messages.mime
    )

    def __init__(self, *, domain: str | None, **connection: Any) -> None:
        super().__init__(**connection)
        self.domain = domain or None

    @classmethod
    def settings_for(cls, settings: Settings) -> dict[str, Any]:
        return {**super().settings_for(settings), "domain": settings.mailgun_domain}

    def _path(self, template: str) -> str:
        assert self.domain is not None
        return template.format(domain=quote(self.domain, safe=""))

    def _auth(self) -> dict[str, str]:
        assert self._api_key is not None
        token = base64.b64encode(f"api:{self._api_key}".encode()).decode("ascii")
        return {"authorization": f"Basic {token}"}

    def _not_ready(self) -> str | None:
        if self._api_key is None:
            return self.missing_key.reason
        if self.domain is None:
            return "MAILGUN_DOMAIN is not set"
        return None

    # --- sending -----------------------------------------------------------------------

    async def send(self, email: OutgoingEmail) -> delivery.SendOutcome:
        missing = self._not_ready()
        if missing is not None:
            return delivery.Disabled(missing)
        try:
            fields = form_fields(email)
            mime = email.raw  # ASCII MIME: NeedsSMTPUTF8 (a ValueError) if it cannot be
        except (ValueError, MessageError) as exc:
            return delivery.Rejected(f"cannot build the Mailgun request: {exc}")
        answer = await http_api.call(
            self._client,
            "POST",
            self._path(SEND_PATH),
            headers=self._auth(),
            data=fields,
            # Sent as Mailgun's own examples send it (curl -F message=@file.mime).
            files={"message": ("message.mime", mime, "application/octet-stream")},
        )
        return ANSWERS.unkeyed_outcome(answer, secret=self._api_key, retry_after=_wait_hint(answer))

    # --- reading back ------------------------------------------------------------------

    async def events(
        self, *, begin: datetime, message_id: str | None = None, recipient: str | None = None
    ) -> list[dict[str, Any]]:
        """Mailgun's event records for this domain since `begin` (oldest first), filtered
        by Mailgun's message id (the Message-ID, without angle brackets) or recipient.
        Raises MailgunLookupError when they cannot be had."""
        missing = self._not_ready()
        if missing is not None:
            raise MailgunLookupError(missing)
        query: dict[str, str | int] = {
            "begin": str(int(begin.timestamp())),
            "ascending": "yes",
            "limit": EVENTS_PAGE_SIZE,
        }
        if message_id is not None:
            query["message-id"] = message_id.strip().strip("<>")
        if recipient is not None:
            query["recipient"] = recipient
        found: list[dict[str, Any]] = []
        url: str | None = self._path(EVENTS_PATH)
        for _ in range(EVENTS_MAX_PAGES):
            assert url is not None
            items, url = await self._events_page(url, query)
            found.extend(items)
            if not items or url is None:
                break
            query = {}
        return found

    async def find_sent(self, message: Message, rfc_message_id: str) -> list[Sighting]:
        """Mailgun's records that may be of one of our messages, each saying whose it is:
        by our Message-ID (Mailgun keeps the MIME's), then by recipient. Which message a
        record belongs to comes from the record itself (our variable, else our Message-ID);
        reconciliation settles a message only from a record of its own. A `rejected`
        record is no sending. Raises MailgunLookupError when Mailgun cannot say."""
        begin = message.created_at - EVENTS_CLOCK_MARGIN
        found = await self.events(begin=begin, message_id=rfc_message_id)
        if not found:
            found = await self.events(begin=begin, recipient=ascii_address(message.to_address))
        return [sighting for record in found if (sighting := _sighting(record)) is not None]

    async def _events_page(
        self, url: str, query: Mapping[str, str | int]
    ) -> tuple[list[dict[str, Any]], str | None]:
        # A `next` URL carries its own query: params (even empty ones) would replace it.
        answer = await http_api.call(
            self._client, "GET", url, headers=self._auth(), params=query or None
        )
        failed = http_api.no_answer(answer, "Mailgun lookup")
        if failed is not None:
            raise MailgunLookupError(kit.scrub(failed[1], self._api_key))
        body = answer.body
        if answer.status != 200 or not isinstance(body, dict):
            raise MailgunLookupError(
                kit.scrub(f"lookup: {_error_text(answer.status or 0, body)}", self._api_key),
                status=answer.status,
            )
        items = body.get("items")
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            text = kit.scrub(f"lookup: unexpected answer: {body!r}", self._api_key)
            raise MailgunLookupError(text)
        return items, self._next_page(body)

    def _next_page(self, body: Mapping[str, Any]) -> str | None:
        """The next page's URL, only on our own API host: the API key goes with it."""
        paging = body.get("paging")
        url = paging.get("next") if isinstance(paging, Mapping) else None
        if isinstance(url, str) and url.startswith(self.base_url + "/"):
            return url
        return None


def _sighting(record: Mapping[str, Any]) -> Sighting | None:
    """What one of Mailgun's event records proves: which of our messages Mailgun had (read
    as from an event: mailgun_events), for whom, under which id. None for a record that
    shows no sending (a `rejected` one) or names no message."""
    if record.get("event") == "rejected":  # Mailgun refused the request: nothing was sent
        return None
    provider_id = mailgun_events.provider_message_id(record)
    if provider_id is None:
        return None
    recipient = record.get("recipient")
    return Sighting(
        provider_message_id=provider_id,
        message_id=mailgun_events.our_message_id(record, provider_id),
        recipient=recipient if isinstance(recipient, str) else None,
    )


def _message_id(answer: Answer) -> str | None:
    taken = answer.body.get("id") if isinstance(answer.body, dict) else None
    return taken if isinstance(taken, str) else None


def _wait_hint(answer: Answer) -> timedelta | None:
    hint = kit.retry_after(answer.headers) if answer.headers else None
    if hint is None and answer.status == 429 and isinstance(answer.body, dict):
        said = _TRY_AGAIN_AFTER.search(str(answer.body.get("message", "")))
        hint = timedelta(seconds=int(said[1])) if said else None
    return hint


def _error_text(status: int, body: Any) -> str:
    if isinstance(body, dict) and "message" in body:
        return f"Mailgun HTTP {status}: {body['message']}"
    return f"Mailgun HTTP {status}" + (f": {body!r}" if body else "")


ANSWERS: Final = http_api.Answers("Mailgun", RESPONSE_TABLE, _message_id, _error_text)

register("mailgun")(MailgunProvider.from_settings)
