"""A real HTTP server that behaves like Postmark's email API, for tests (tests/esp_fake.py
has what every fake ESP does: threads, keep-alive, fault injection, and checking every
request against the spec, here tests/data/specs/postmark.yaml).

What it implements of Postmark:
- `POST /email` and `POST /email/batch` (at most 500): the `X-Postmark-Server-Token`
  header (else 401, ErrorCode 10). Each message: at most 50 recipients (To, Cc, Bcc) else
  ErrorCode 300; a recipient marked inactive (`deactivate`) ErrorCode 406; else sent, with
  a new MessageID. A single send answers 200 or 422 with the ErrorCode; a batch answers
  200 with one result per message, in order. What was sent is kept as `Sent` records.
- `GET /messages/outbound?count=&offset=&recipient=&metadata_<key>=`: what it sent, as
  Postmark lists it (newest first).
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from email.utils import getaddresses
from typing import Any

from esp_fake import FakeESP, RecordedRequest, Reply

DEFAULT_TOKEN = "postmark-server-token-0000-test"
MAX_RECIPIENTS = 50
MAX_BATCH = 500


@dataclass(frozen=True)
class Sent:
    """One message Postmark took."""

    message_id: str
    request: dict[str, Any]  # the message as it came (a single body, or a batch item)
    stream: str
    to: list[str] = field(default_factory=list)  # addresses, as parsed from the strings
    cc: list[str] = field(default_factory=list)
    bcc: list[str] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {h["Name"]: h["Value"] for h in self.request.get("Headers", [])}

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self.request.get("Metadata", {}))

    def attachment(self, name: str) -> tuple[bytes, dict[str, str]]:
        """The decoded bytes of the one attachment called `name`, and its fields."""
        (found,) = [a for a in self.request.get("Attachments", []) if a["Name"] == name]
        return base64.b64decode(found["Content"], validate=True), found

    def listed(self) -> dict[str, Any]:
        return {
            "MessageID": self.message_id,
            "Recipients": [*self.to, *self.cc, *self.bcc],
            "Status": "Sent",
            "Subject": self.request.get("Subject", ""),
            "MessageStream": self.stream,
            "Metadata": self.metadata,
            **({"Tag": self.request["Tag"]} if "Tag" in self.request else {}),
        }


def _addresses(value: str | None) -> list[str]:
    return [address for _, address in getaddresses([value])] if value else []


class PostmarkServer(FakeESP):
    spec_file = "postmark.yaml"
    host_url = "https://api.postmarkapp.com"
    name = "postmark"

    def __init__(self, token: str = DEFAULT_TOKEN) -> None:
        super().__init__()
        self.token = token
        self._sent: list[Sent] = []
        self._inactive: set[str] = set()

    def sent(self) -> list[Sent]:
        with self._lock:
            return list(self._sent)

    def deactivate(self, address: str) -> None:
        """Mark a recipient inactive (it bounced hard, or complained): ErrorCode 406."""
        with self._lock:
            self._inactive.add(address.lower())

    def invalid(self, request: RecordedRequest, problem: str) -> Reply:
        return Reply(422, {"ErrorCode": 300, "Message": f"Invalid email request: {problem}"})

    def answer(self, request: RecordedRequest) -> Reply:
        route = (request.method, request.path)
        if route not in {
            ("POST", "/email"),
            ("POST", "/email/batch"),
            ("GET", "/messages/outbound"),
        }:
            return Reply(404, {"ErrorCode": 404, "Message": "not found"})
        if request.headers.get("x-postmark-server-token") != self.token:
            return Reply(401, {"ErrorCode": 10, "Message": "Bad or missing Server API token"})
        if route == ("GET", "/messages/outbound"):
            return Reply(200, self._search(request.query))
        if route == ("POST", "/email"):
            result = self._take(request.json)
            return Reply(200 if result["ErrorCode"] == 0 else 422, result)
        if len(request.json) > MAX_BATCH:
            return Reply(422, {"ErrorCode": 410, "Message": "Too many batch messages"})
        return Reply(200, [self._take(message) for message in request.json])

    def _take(self, message: dict[str, Any]) -> dict[str, Any]:
        to, cc, bcc = (_addresses(message.get(f)) for f in ("To", "Cc", "Bcc"))
        if len(to) + len(cc) + len(bcc) > MAX_RECIPIENTS:
            return {"ErrorCode": 300, "Message": "Maximum of 50 recipients allowed"}
        inactive = [a.lower() for a in (*to, *cc, *bcc) if a.lower() in self._inactive]
        if inactive:
            return {
                "ErrorCode": 406,
                "Message": "You tried to send to recipient(s) that have been marked as "
                f"inactive. Found inactive addresses: {', '.join(inactive)}. Inactive "
                "recipients are ones that have generated a hard bounce or a spam complaint.",
            }
        sent = Sent(
            str(uuid.uuid4()), message, message.get("MessageStream", "outbound"), to, cc, bcc
        )
        self._sent.append(sent)
        return {
            "To": message["To"],
            "SubmittedAt": "2026-01-01T12:00:00.0000000Z",
            "MessageID": sent.message_id,
            "ErrorCode": 0,
            "Message": "OK",
        }

    def _search(self, query: dict[str, str]) -> dict[str, Any]:
        metadata = {
            k.removeprefix("metadata_"): v for k, v in query.items() if k.startswith("metadata_")
        }
        recipient = query.get("recipient", "").lower()
        found = [
            sent.listed()
            for sent in reversed(self._sent)
            if (not recipient or recipient in [a.lower() for a in (*sent.to, *sent.cc, *sent.bcc)])
            and all(sent.metadata.get(k) == v for k, v in metadata.items())
        ]
        offset, count = int(query["offset"]), int(query["count"])
        return {"TotalCount": len(found), "Messages": found[offset : offset + count]}
