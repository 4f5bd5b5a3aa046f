"""A real HTTP server that behaves like SendGrid's v3 Mail Send API, for tests
(tests/esp_fake.py has what every fake ESP does: threads, keep-alive, fault injection, and
checking every request against the spec, here tests/data/specs/sendgrid.yaml).

What it implements of SendGrid:
- `POST /v3/mail/send`: `Authorization: Bearer <key>` (else 401, SendGrid's error shape
  `{"errors": [{"message", "field", "help"}]}`). The body is checked against the published
  schema by openapi-core (esp_fake), and here for what SendGrid's reference states only in
  prose: `content` (or `template_id`) present, text/plain before text/html, no address
  twice in a personalization, at most 1000 recipients in one, `reply_to` or
  `reply_to_list` but not both, an inline attachment with a `content_id`, base64 content,
  string values in `headers` and `custom_args`, no header SendGrid forbids, and addresses
  in ASCII (JSON Schema's `format: email` is RFC 5321's, which openapi-core checks only for
  an @). A request breaking any is 400. One it takes is a `Delivery`, answered 202 with
  no body and its `X-Message-Id` header.
- `reject_recipient(address)`: a request naming it is 400, as SendGrid refuses an address.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass
from typing import Any

from esp_fake import FakeESP, RecordedRequest, Reply

SEND_PATH = "/v3/mail/send"
DEFAULT_API_KEY = "SG.test-0000000000000000.sendgrid-server"
MAX_RECIPIENTS = 1000  # per personalization: to, cc and bcc together
FORBIDDEN_HEADERS = frozenset(
    {
        "x-sg-id",
        "x-sg-eid",
        "received",
        "dkim-signature",
        "content-type",
        "content-transfer-encoding",
        "to",
        "from",
        "subject",
        "reply-to",
        "cc",
        "bcc",
    }
)


class _Refused(Exception):
    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def error_body(message: str, field: str | None = None) -> dict[str, Any]:
    """SendGrid's error shape (the spec's ErrorResponse)."""
    return {"errors": [{"message": message, "field": field, "help": None}]}


@dataclass(frozen=True)
class Delivery:
    """One message SendGrid took."""

    message_id: str  # its X-Message-Id
    body: dict[str, Any]  # the request as it came

    @property
    def personalization(self) -> dict[str, Any]:
        (only,) = self.body["personalizations"]
        result: dict[str, Any] = only
        return result

    def emails(self, field: str) -> list[str]:
        return [a["email"] for a in self.personalization.get(field, [])]

    @property
    def recipient_emails(self) -> list[str]:
        return [*self.emails("to"), *self.emails("cc"), *self.emails("bcc")]

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.body.get("headers", {}))

    @property
    def custom_args(self) -> dict[str, str]:
        return dict(self.personalization.get("custom_args", {}))

    def content(self, kind: str) -> str | None:
        found = [c["value"] for c in self.body.get("content", []) if c["type"] == kind]
        return found[0] if found else None

    def attachment(self, filename: str) -> tuple[bytes, dict[str, Any]]:
        """The decoded bytes of the one attachment called `filename`, and its fields."""
        (found,) = [a for a in self.body.get("attachments", []) if a["filename"] == filename]
        return base64.b64decode(found["content"], validate=True), found


class SendGridServer(FakeESP):
    spec_file = "sendgrid.yaml"
    host_url = "https://api.sendgrid.com"
    name = "sendgrid"

    def __init__(self, api_key: str = DEFAULT_API_KEY) -> None:
        super().__init__()
        self.api_key = api_key
        self._deliveries: list[Delivery] = []
        self._rejected: dict[str, str] = {}

    def delivered(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def send_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if (r.method, r.path) == ("POST", SEND_PATH)]

    def reject_recipient(self, address: str) -> None:
        with self._lock:
            self._rejected[address.lower()] = f"Does not contain a valid address: {address}"

    def invalid(self, request: RecordedRequest, problem: str) -> Reply:
        return Reply(400, error_body(problem))

    def answer(self, request: RecordedRequest) -> Reply:
        if request.path != SEND_PATH:
            return Reply(404, error_body("not found"))
        if request.method != "POST":
            return Reply(405, error_body("method not allowed"))
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return Reply(
                401,
                error_body("The provided authorization grant is invalid, expired, or revoked"),
            )
        try:
            _check_prose_rules(request.json)
            self._check_recipients(request.json)
        except _Refused as refused:
            return Reply(400, error_body(str(refused), refused.field))
        message_id = secrets.token_urlsafe(16)[:22]
        self._deliveries.append(Delivery(message_id, request.json))
        return Reply(202, None, {"X-Message-Id": message_id})

    def _check_recipients(self, body: dict[str, Any]) -> None:
        for p_index, personalization in enumerate(body["personalizations"]):
            for field in ("to", "cc", "bcc"):
                for a_index, address in enumerate(personalization.get(field, [])):
                    reason = self._rejected.get(address["email"].lower())
                    if reason is not None:
                        raise _Refused(reason, f"personalizations.{p_index}.{field}.{a_index}")


def _check_prose_rules(body: dict[str, Any]) -> None:
    """What SendGrid's reference says of a send beyond the schema (see the module doc)."""
    _check_content(body)
    for index, personalization in enumerate(body["personalizations"]):
        _check_personalization(personalization, f"personalizations.{index}")
    addresses = [body["from"], *([body["reply_to"]] if "reply_to" in body else [])]
    addresses += body.get("reply_to_list", [])
    for address in addresses:
        _check_ascii_email(address["email"], "from/reply_to")
    if "reply_to" in body and "reply_to_list" in body:
        raise _Refused("reply_to and reply_to_list cannot both be set", "reply_to_list")
    for name, value in body.get("headers", {}).items():
        if name.lower() in FORBIDDEN_HEADERS:
            raise _Refused(f"The header {name} is not allowed", "headers")
        if not isinstance(value, str):
            raise _Refused("Invalid type. Expected: string", f"headers.{name}")
    for index, attachment in enumerate(body.get("attachments", [])):
        _check_attachment(attachment, f"attachments.{index}")


def _check_content(body: dict[str, Any]) -> None:
    content = body.get("content", [])
    if not content and "template_id" not in body:
        raise _Refused("Unless a valid template_id is provided, content is required", "content")
    kinds = [part["type"] for part in content]
    if "text/html" in kinds and "text/plain" in kinds and kinds.index("text/plain") > 0:
        raise _Refused("text/plain must come before text/html", "content")


def _check_personalization(personalization: dict[str, Any], where: str) -> None:
    seen: set[str] = set()
    count = 0
    for field in ("to", "cc", "bcc"):
        for address in personalization.get(field, []):
            key = address["email"].lower()
            _check_ascii_email(address["email"], f"{where}.{field}")
            if key in seen:
                raise _Refused(
                    "Each email address in the personalization block should be unique "
                    "between to, cc, and bcc",
                    f"{where}.{field}",
                )
            seen.add(key)
            count += 1
    if count > MAX_RECIPIENTS:
        raise _Refused(f"at most {MAX_RECIPIENTS} recipients per personalization", where)
    for name, value in personalization.get("custom_args", {}).items():
        if not isinstance(value, str):
            raise _Refused("Bad Request", f"{where}.custom_args.{name}")


def _check_attachment(attachment: dict[str, Any], where: str) -> None:
    try:
        base64.b64decode(attachment["content"], validate=True)
    except (binascii.Error, ValueError):
        raise _Refused("The attachment content must be base64 encoded", where) from None
    if attachment.get("disposition") == "inline" and not attachment.get("content_id"):
        raise _Refused("An inline attachment needs a content_id", f"{where}.content_id")


def _check_ascii_email(address: str, where: str) -> None:
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain or not address.isascii():
        raise _Refused(f"Does not contain a valid address: {address!r}", where)
