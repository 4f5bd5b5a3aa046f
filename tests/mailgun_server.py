"""A real HTTP server that behaves like Mailgun's Messages and Events APIs, for tests
(tests/esp_fake.py has what every fake ESP does: threads, keep-alive, fault injection, and
checking every request against the spec, here tests/data/specs/mailgun.yaml).

What it implements of Mailgun:
- `POST /v3/{domain}/messages.mime`, multipart/form-data: HTTP Basic `api:<key>` (else 401
  `"Forbidden"`), a domain of the account (else 404 "Domain not found"). The form is checked
  against the published schema by openapi-core (with `form_loads`, below), and here for
  what Mailgun documents in prose: at least one `to`, each an address; a `message` that is
  a MIME message with a From; at most 3 `o:tag`, ASCII, 128 characters each; the send
  options (o:, h:, v:, t:) at most 16 KB together. A request breaking any is 400
  `{"message"}`. One it takes is a `Delivery`, answered 200 `{id, message}`; the id is the
  MIME's Message-ID (Mailgun keeps the one a MIME message has).
- `GET /v3/{domain}/events?begin=&ascending=yes&limit=&message-id=&recipient=`: an
  `accepted` record per recipient of each delivery, as the Events API lists them, a page
  at a time; `paging.next` is a URL on this server (past the last page, an empty one).
- `reject_recipient(address)`: a send naming it is 400, as Mailgun refuses an address.
"""

from __future__ import annotations

import base64
import email.policy
import functools
import itertools
import secrets
import time
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.parser import BytesParser
from email.utils import parseaddr
from typing import Any
from urllib.parse import urlencode

from openapi_core import Config, OpenAPI
from openapi_core.deserializing.media_types.util import data_form_loads
from werkzeug.datastructures import ImmutableMultiDict

from esp_fake import SPECS, FakeESP, RecordedRequest, Reply

DEFAULT_API_KEY = "key-test-0000000000000000-mailgun-server"
DEFAULT_DOMAIN = "mg.example.com"
MAX_TAGS = 3
TAG_MAX = 128
OPTIONS_MAX_BYTES = 16 * 1024  # "Send options (parameters starting with o:, h:, v:, or t:)"


class _Form(ImmutableMultiDict[str, Any]):
    """A form whose absent field is absent: openapi-core reads a missing array field of a
    multipart body as an empty list (`getlist`), which would let `required: [to]` pass."""

    def getlist(self, key: str, type: Any = None) -> list[Any]:
        if key not in self:
            raise KeyError(key)
        return super().getlist(key, type)


def form_loads(value: bytes, **parameters: str) -> ImmutableMultiDict[str, Any]:
    """openapi-core's own multipart reader, with two adaptations so its OAS 3.1 validator
    checks Mailgun's form as the spec says: each part's bytes as text (3.1 has no `bytes`
    type, so a `format: binary` file part would fail `type: string`; mailbag's MIME is
    7-bit or UTF-8 text), and a missing field missing (`_Form`)."""
    parts = data_form_loads(value, **parameters)
    return _Form(
        (name, part.decode("utf-8", "surrogateescape") if isinstance(part, bytes) else part)
        for name, part in parts.items(multi=True)
    )


@functools.cache
def _mailgun_spec() -> OpenAPI:
    """The spec, its multipart form read through form_loads (see there)."""
    config = Config(extra_media_type_deserializers={"multipart/form-data": form_loads})
    return OpenAPI.from_path((SPECS / MailgunServer.spec_file).resolve(), config=config)


class _Refused(Exception):
    pass


@dataclass(frozen=True)
class Delivery:
    """One message Mailgun took."""

    message_id: str  # as the send answered it, with angle brackets
    domain: str
    to: list[str]  # the envelope recipients, as the form gave them
    mime: bytes
    fields: dict[str, list[str]]  # every text field, by name
    taken_at: float

    @property
    def message(self) -> EmailMessage:
        parsed: EmailMessage = BytesParser(policy=email.policy.default).parsebytes(self.mime)
        return parsed

    @property
    def variables(self) -> dict[str, str]:
        return {k[2:]: v[-1] for k, v in self.fields.items() if k.startswith("v:")}

    @property
    def tags(self) -> list[str]:
        return list(self.fields.get("o:tag", []))

    def records(self) -> list[dict[str, Any]]:
        """The Events API's `accepted` record for each recipient."""
        headers = self.message
        return [
            {
                "event": "accepted",
                "id": secrets.token_urlsafe(16),
                "timestamp": self.taken_at,
                "log-level": "info",
                "recipient": recipient,
                "message": {
                    "headers": {
                        "to": headers["To"],
                        "message-id": self.message_id.strip("<>"),
                        "from": headers["From"],
                        "subject": headers["Subject"],
                    },
                    "attachments": [],
                    "size": len(self.mime),
                },
                "tags": self.tags,
                "user-variables": self.variables,
            }
            for recipient in self.to
        ]


@dataclass
class _Page:
    filters: dict[str, str]
    offset: int
    limit: int
    begin: float = field(default=0.0)


class MailgunServer(FakeESP):
    spec_file = "mailgun.yaml"
    host_url = "https://api.mailgun.net"
    name = "mailgun"

    def __init__(self, api_key: str = DEFAULT_API_KEY, domain: str = DEFAULT_DOMAIN) -> None:
        super().__init__()
        self.api_key = api_key
        self.domain = domain
        self._deliveries: list[Delivery] = []
        self._rejected: set[str] = set()
        self._pages: dict[str, _Page] = {}
        self._page_ids = itertools.count(1)

    def openapi(self) -> OpenAPI:
        return _mailgun_spec()

    def delivered(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def send_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == "POST"]

    def reject_recipient(self, address: str) -> None:
        with self._lock:
            self._rejected.add(address.lower())

    def invalid(self, request: RecordedRequest, problem: str) -> Reply:
        return Reply(400, {"message": problem})

    def answer(self, request: RecordedRequest) -> Reply:
        parts = request.path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "v3" or parts[2] not in {"messages.mime", "events"}:
            return Reply(404, {"message": "Not Found"})
        if request.headers.get("authorization") != _basic(self.api_key):
            return Reply(401, "Forbidden")
        if parts[1] != self.domain:
            return Reply(404, {"message": f"Domain not found: {parts[1]}"})
        if parts[2] == "events" and request.method == "GET":
            return Reply(200, self._events(request.query))
        if parts[2] == "messages.mime" and request.method == "POST":
            try:
                return Reply(200, self._take(request))
            except _Refused as refused:
                return Reply(400, {"message": str(refused)})
        return Reply(405, {"message": "Method Not Allowed"})

    def _take(self, request: RecordedRequest) -> dict[str, str]:
        form = form_loads(request.body, **_parameters(request.headers["content-type"]))
        fields = {k: form.getlist(k) for k in form if k != "message"}
        to = fields.get("to", [])
        if not to:
            raise _Refused("'to' parameter is missing")
        for address in to:
            if "@" not in parseaddr(address)[1]:
                raise _Refused("'to' parameter is not a valid address. please check documentation")
            if address.lower() in self._rejected:
                raise _Refused(f"to parameter is not a valid address: {address}")
        tags = fields.get("o:tag", [])
        if len(tags) > MAX_TAGS or not all(t.isascii() and len(t) <= TAG_MAX for t in tags):
            raise _Refused("at most 3 tags, ASCII, 128 characters each")
        options = sum(
            len(k) + len(v.encode())
            for k, vs in fields.items()
            if k[:2] in {"o:", "h:", "v:", "t:"}
            for v in vs
        )
        if options > OPTIONS_MAX_BYTES:
            raise _Refused(
                "Send options (parameters starting with o:, h:, or v:) are limited to 16KB total"
            )
        mime = form["message"].encode("utf-8", "surrogateescape")
        parsed = BytesParser(policy=email.policy.default).parsebytes(mime)
        if not parsed["From"]:
            raise _Refused("the message has no From header")
        message_id = parsed["Message-ID"] or f"<{secrets.token_hex(8)}@{self.domain}>"
        self._deliveries.append(Delivery(message_id, self.domain, to, mime, fields, time.time()))
        return {"id": message_id, "message": "Queued. Thank you."}

    def _events(self, query: dict[str, str]) -> dict[str, Any]:
        page = self._pages.pop(query["page"], None) if "page" in query else None
        if page is None:
            filters = {k: query[k] for k in ("message-id", "recipient") if k in query}
            page = _Page(filters, 0, int(query.get("limit", 300)), float(query.get("begin", 0)))
        records = [
            record
            for delivery in self._deliveries
            for record in delivery.records()
            if record["timestamp"] >= page.begin
            and page.filters.get("message-id", record["message"]["headers"]["message-id"])
            == record["message"]["headers"]["message-id"]
            and page.filters.get("recipient", record["recipient"]).lower()
            == record["recipient"].lower()
        ]
        items = records[page.offset : page.offset + page.limit]
        token = f"p{next(self._page_ids)}"
        self._pages[token] = _Page(page.filters, page.offset + len(items), page.limit, page.begin)
        base = f"{self.url}/v3/{self.domain}/events"
        return {"items": items, "paging": {"next": f"{base}?{urlencode({'page': token})}"}}


def _basic(key: str) -> str:
    return "Basic " + base64.b64encode(f"api:{key}".encode()).decode("ascii")


def _parameters(content_type: str) -> dict[str, str]:
    _, _, rest = content_type.partition(";")
    pairs = (item.strip().partition("=") for item in rest.split(";") if "=" in item)
    return {name.lower(): value.strip('"') for name, _, value in pairs}
