"""A real HTTP server that behaves like Resend's email API, for tests (tests/esp_fake.py has
what every fake ESP does: threads, keep-alive, fault injection, and checking every request
against Resend's published spec, trimmed in tests/data/specs/resend.yaml).

What it implements of Resend, from its documentation where the spec is silent:
- `POST /emails` and `POST /emails/batch` (1 to 100): `Authorization: Bearer` (none: 401
  missing_api_key; another key: 403 invalid_api_key). Tag names and values of ASCII
  letters, digits, `_` and `-` only, at most 256; no attachments in a batch; a recipient
  refused by `reject_recipient`: each 422 validation_error, and a batch with one bad email
  sends none of them. What was sent is kept as `Sent` records.
- `Idempotency-Key` (at most 256): the same key with the same body within the window (24
  hours) answers the first response again and sends nothing; with another body 409
  invalid_idempotent_request.
- `GET /emails/{id}` and `GET /emails` (newest first, `limit`, `after`): what it sent,
  with `last_event` (`set_last_event`) and `message_id`, the Message-ID header it was sent
  with (this fake keeps the caller's, as a mail server that respects it does).
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from esp_fake import FakeESP, RecordedRequest, Reply

DEFAULT_API_KEY = "re_test_0000000000000000_resend_server"
MAX_BATCH = 100
TAG_TEXT = re.compile(r"^[A-Za-z0-9_-]{1,256}$")


@dataclass
class Sent:
    """One email Resend took."""

    id: str
    request: dict[str, Any]
    idempotency_key: str | None
    created_at: datetime
    last_event: str = "sent"
    batch: bool = False

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.request.get("headers", {}))

    @property
    def tags(self) -> dict[str, str]:
        return {tag["name"]: tag["value"] for tag in self.request.get("tags", [])}

    def attachment(self, filename: str) -> tuple[bytes, dict[str, str]]:
        (found,) = [a for a in self.request.get("attachments", []) if a["filename"] == filename]
        return base64.b64decode(found["content"], validate=True), found

    def listed(self) -> dict[str, Any]:
        to = self.request["to"]
        return {
            "object": "email",
            "id": self.id,
            "to": to if isinstance(to, list) else [to],
            "from": self.request["from"],
            "subject": self.request["subject"],
            "created_at": self.created_at.isoformat(),
            "last_event": self.last_event,
            "message_id": self.headers.get("Message-ID", f"<{self.id}@resend.dev>"),
        }


def _error(status: int, name: str, message: str) -> Reply:
    return Reply(status, {"statusCode": status, "name": name, "message": message})


class _Refused(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)


class ResendServer(FakeESP):
    spec_file = "resend.yaml"
    host_url = "https://api.resend.com"
    name = "resend"

    def __init__(
        self,
        api_key: str = DEFAULT_API_KEY,
        *,
        idempotency_window: timedelta = timedelta(hours=24),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        super().__init__()
        self.api_key = api_key
        self.idempotency_window = idempotency_window
        self.clock = clock
        self._sent: list[Sent] = []
        self._keys: dict[str, tuple[datetime, bytes, Reply]] = {}
        self._rejected: set[str] = set()

    def sent(self) -> list[Sent]:
        with self._lock:
            return list(self._sent)

    def reject_recipient(self, address: str) -> None:
        with self._lock:
            self._rejected.add(address.lower())

    def set_last_event(self, email_id: str, event: str) -> None:
        with self._lock:
            (found,) = [s for s in self._sent if s.id == email_id]
            found.last_event = event

    def invalid(self, request: RecordedRequest, problem: str) -> Reply:
        return _error(422, "validation_error", problem)

    def answer(self, request: RecordedRequest) -> Reply:
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return _error(401, "missing_api_key", "Missing API key in the authorization header.")
        if auth.removeprefix("Bearer ") != self.api_key:
            return _error(403, "invalid_api_key", "API key is invalid")
        if request.method == "GET":
            return self._get(request)
        if request.path not in {"/emails", "/emails/batch"}:
            return _error(404, "not_found", "The requested endpoint does not exist.")
        key = request.headers.get("idempotency-key")
        now = self.clock()
        if key is not None and key in self._keys:
            seen, body, reply = self._keys[key]
            if now - seen < self.idempotency_window:
                if body != request.body:
                    return _error(409, "invalid_idempotent_request", "Same key, other payload.")
                return reply  # the first response, and nothing sent again
        try:
            reply = self._send(request, now, key)
        except _Refused as exc:
            return _error(422, "validation_error", str(exc))
        if key is not None:
            self._keys[key] = (now, request.body, reply)
        return reply

    def _send(self, request: RecordedRequest, now: datetime, key: str | None) -> Reply:
        batch = request.path == "/emails/batch"
        emails = request.json if batch else [request.json]
        if batch and len(emails) > MAX_BATCH:
            raise _Refused(f"at most {MAX_BATCH} emails in a batch")
        for email in emails:
            self._refuse(email, batch=batch)
        sent = [Sent(str(uuid.uuid4()), email, key, now, batch=batch) for email in emails]
        self._sent.extend(sent)
        if batch:
            return Reply(200, {"data": [{"id": s.id} for s in sent]})
        return Reply(200, {"id": sent[0].id})

    def _refuse(self, email: dict[str, Any], *, batch: bool) -> None:
        if batch and email.get("attachments"):
            raise _Refused("Attachments are not supported in the batch endpoint")
        for tag in email.get("tags", []):
            for part in ("name", "value"):
                if not TAG_TEXT.match(str(tag.get(part, ""))):
                    raise _Refused(
                        f"tag {part} {tag.get(part)!r}: only ASCII letters, numbers, _ or -"
                    )
        recipients = [email["to"]] if isinstance(email["to"], str) else list(email["to"])
        for field_name in ("cc", "bcc"):
            recipients += email.get(field_name, [])
        for recipient in recipients:
            address = recipient.rpartition("<")[2].rstrip(">").lower()
            if address in self._rejected:
                raise _Refused(f"Invalid `to` field. {address}")

    def _get(self, request: RecordedRequest) -> Reply:
        if request.path == "/emails":
            newest = list(reversed(self._sent))
            after = request.query.get("after")
            if after is not None:
                ids = [s.id for s in newest]
                newest = newest[ids.index(after) + 1 :] if after in ids else []
            limit = int(request.query.get("limit", 20))
            page = newest[:limit]
            return Reply(
                200,
                {
                    "object": "list",
                    "has_more": len(newest) > limit,
                    "data": [s.listed() for s in page],
                },
            )
        email_id = request.path.removeprefix("/emails/")
        for sent in self._sent:
            if sent.id == email_id:
                return Reply(200, sent.listed())
        return _error(404, "not_found", "Email not found")
