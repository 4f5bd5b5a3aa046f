"""A real HTTP server that behaves like Brevo's transactional email API, for tests.

It listens on 127.0.0.1 (a free port) in a background thread and speaks HTTP/1.1 with
keep-alive, so a client under test goes through its real connection pool, timeouts and
error paths. What it implements of Brevo:

- `POST /v3/smtp/email`: the `api-key` header (else 401 `unauthorized`); the body checked
  against Brevo's published schema for `sendSmtpEmail` (written out below: types, required
  fields, `format: email` -- ASCII, so a Unicode IDN domain fails as at Brevo) and the
  rules its descriptions state (single: a non-empty `to`; batch: 1..1000
  `messageVersions`, no outer `to`, at most 99 recipients (To, Cc, Bcc) a version and 2000
  a request; names at most 70 characters; an attachment has `url` or base64 `content`, a
  `name` with its content, and a documented file extension); else 400 `invalid_parameter`;
  201 `{"messageId"}` or `{"messageIds": [...]}` in version order. What it took is kept as
  `Delivery` records (a version's own `cc`/`bcc`/`replyTo` replace the call's, as Brevo
  documents), attachments decoded; every request's JSON body is kept as it came.
- idempotency: a `headers.idempotencyKey` (a UUID) seen within the window is not delivered
  again. Brevo documents answering such a repeat with 400 `duplicate_parameter`; that is
  the default here (`duplicate_key="reject"`); `duplicate_key="replay"` answers 201 with
  the first request's ids instead.
- `GET /v3/smtp/emails?messageId=|email=`: what it accepted, as Brevo lists it.

Failure injection (each applies to the next matching requests, in the order added):
`fail_next` answers a given status/body/headers without processing the request;
`hang_after_accept` accepts the request (it counts as delivered) and then holds the answer
past the client's timeout; `drop_after_accept` accepts it and closes the connection without
answering; `reject_recipient` makes any request naming that address fail with 400.

    with BrevoServer() as brevo:
        provider = BrevoProvider(api_key=brevo.api_key, base_url=brevo.url)
        ...
        assert len(brevo.delivered()) == 1
"""

from __future__ import annotations

import base64
import binascii
import enum
import itertools
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from http_server import PeerHTTPServer

SEND_PATH = "/v3/smtp/email"
LIST_PATH = "/v3/smtp/emails"
DEFAULT_API_KEY = "xkeysib-test-0000000000000000-brevo-server"
MAX_VERSIONS = 1000
MAX_RECIPIENTS_PER_VERSION = 99
MAX_RECIPIENTS_PER_CALL = 2000
Json = Any


class Endpoint(enum.StrEnum):
    SEND = "send"  # POST /v3/smtp/email
    LOOKUP = "lookup"  # GET /v3/smtp/emails
    ANY = "any"


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str  # without the query
    query: dict[str, list[str]]
    headers: dict[str, str]  # names in lower case
    json: Json  # the parsed body; None when there was none or it was not JSON

    @property
    def is_send(self) -> bool:
        return self.method == "POST" and self.path == SEND_PATH

    @property
    def versions(self) -> list[dict[str, Any]]:
        """The message versions of a batch send; empty for anything else."""
        if isinstance(self.json, dict) and isinstance(self.json.get("messageVersions"), list):
            return list(self.json["messageVersions"])
        return []


@dataclass(frozen=True)
class ReceivedAttachment:
    """One attachment as Brevo took it: its name and its decoded bytes (None: by `url`)."""

    name: str
    content: bytes | None
    url: str | None = None


@dataclass(frozen=True)
class Delivery:
    """One email Brevo took: a single send, or one version of a batch."""

    message_id: str
    uuid: str
    sender: dict[str, Any]
    to: list[dict[str, Any]]
    subject: str
    html: str | None
    text: str | None
    headers: dict[str, str]
    tags: list[str]
    idempotency_key: str | None
    accepted_at: datetime
    cc: list[dict[str, Any]] = field(default_factory=list)
    bcc: list[dict[str, Any]] = field(default_factory=list)
    reply_to: dict[str, Any] | None = None
    attachments: list[ReceivedAttachment] = field(default_factory=list)

    @property
    def to_emails(self) -> list[str]:
        return [recipient["email"] for recipient in self.to]

    @property
    def recipient_emails(self) -> list[str]:
        """Everyone it went to: To, Cc and Bcc."""
        return [recipient["email"] for recipient in (*self.to, *self.cc, *self.bcc)]

    def attachment(self, name: str) -> bytes:
        """The bytes of the one attachment called `name` (AssertionError if not exactly one)."""
        found = [a.content for a in self.attachments if a.name == name]
        assert len(found) == 1 and found[0] is not None, (name, self.attachments)
        return found[0]

    def listed(self, recipient: str) -> dict[str, Any]:
        """How `GET /v3/smtp/emails` shows it, for one recipient."""
        return {
            "email": recipient,
            "subject": self.subject,
            "messageId": self.message_id,
            "uuid": self.uuid,
            "date": self.accepted_at.isoformat(timespec="milliseconds"),
            "from": self.sender.get("email"),
            "tags": list(self.tags),
        }


@dataclass
class _Fault:
    kind: Literal["respond", "hang", "drop"]
    endpoint: Endpoint
    remaining: int
    status: int = 0
    body: Json = None
    headers: dict[str, str] = field(default_factory=dict)
    hang_seconds: float = 0.0

    def matches(self, endpoint: Endpoint) -> bool:
        return self.endpoint is Endpoint.ANY or self.endpoint is endpoint


@dataclass(frozen=True)
class _Reply:
    status: int
    body: Json
    headers: dict[str, str] = field(default_factory=dict)
    after_accept: _Fault | None = None  # a hang or drop to act out instead of answering


class _InvalidRequest(Exception):
    def __init__(self, message: str, code: str = "invalid_parameter") -> None:
        super().__init__(message)
        self.code = code


class BrevoServer:
    def __init__(
        self,
        api_key: str = DEFAULT_API_KEY,
        *,
        idempotency_window: timedelta = timedelta(minutes=15),
        duplicate_key: Literal["reject", "replay"] = "reject",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api_key = api_key
        self.idempotency_window = idempotency_window
        self.duplicate_key = duplicate_key
        self.clock = clock
        self._lock = threading.Lock()
        self._release = threading.Event()  # lets held (hanging) answers go at once
        self._requests: list[RecordedRequest] = []
        self._deliveries: list[Delivery] = []
        self._faults: list[_Fault] = []
        self._rejected_recipients: dict[str, str] = {}
        self._keys: dict[str, tuple[datetime, list[str]]] = {}  # key -> (first seen, ids)
        self._counter = itertools.count(1)
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> BrevoServer:
        http = PeerHTTPServer(("127.0.0.1", 0), _Handler)
        http.brevo = self  # type: ignore[attr-defined]
        self._http = http
        # A short poll interval: `stop` waits up to one interval for the loop to notice.
        self._thread = threading.Thread(
            target=http.serve_forever, kwargs={"poll_interval": 0.05}, name="brevo-server"
        )
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._http = self._thread = None

    def __enter__(self) -> BrevoServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._http is not None, "start the server first"
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    # --- what happened -------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def send_requests(self) -> list[RecordedRequest]:
        return [request for request in self.requests if request.is_send]

    def delivered(self) -> list[Delivery]:
        """Distinct deliveries, in the order accepted; a deduplicated repeat adds none."""
        with self._lock:
            return list(self._deliveries)

    def clear(self) -> None:
        """Forget requests, deliveries, keys and pending faults (the key and port stay)."""
        with self._lock:
            self._requests.clear()
            self._deliveries.clear()
            self._faults.clear()
            self._rejected_recipients.clear()
            self._keys.clear()

    # --- failure injection ---------------------------------------------------------------

    def fail_next(
        self,
        status: int,
        body: Json = None,
        *,
        headers: dict[str, str] | None = None,
        times: int = 1,
        endpoint: Endpoint = Endpoint.SEND,
    ) -> None:
        """The next `times` matching requests get this answer and are not processed."""
        if body is None:
            body = {"code": _code_for(status), "message": f"injected failure {status}"}
        self._add(_Fault("respond", endpoint, times, status, body, dict(headers or {})))

    def rate_limit_next(self, reset_seconds: int, *, times: int = 1) -> None:
        """429 as Brevo sends it, with its x-sib-ratelimit-* headers."""
        self.fail_next(
            429,
            {"code": "too_many_requests", "message": "The expected rate limit is exceeded."},
            headers={
                "x-sib-ratelimit-limit": "1000",
                "x-sib-ratelimit-remaining": "0",
                "x-sib-ratelimit-reset": str(reset_seconds),
            },
            times=times,
        )

    def hang_after_accept(self, *, times: int = 1, seconds: float = 10.0) -> None:
        """Accept the next `times` sends (they are delivered), then hold each answer for
        `seconds` (or until `stop`/`release_held`): the client times out not knowing."""
        self._add(_Fault("hang", Endpoint.SEND, times, hang_seconds=seconds))

    def drop_after_accept(self, *, times: int = 1) -> None:
        """Accept the next `times` sends (they are delivered), then close the connection
        without answering."""
        self._add(_Fault("drop", Endpoint.SEND, times))

    def reject_recipient(self, address: str, message: str | None = None) -> None:
        """Any send naming this address (in `to` or in any version) fails with 400."""
        with self._lock:
            self._rejected_recipients[address.lower()] = (
                message or f"email is not valid in to: {address}"
            )

    def release_held(self) -> None:
        self._release.set()

    def _add(self, fault: _Fault) -> None:
        if fault.remaining < 1:
            raise ValueError("times must be at least 1")
        with self._lock:
            self._faults.append(fault)

    def _take_fault(self, endpoint: Endpoint, kinds: set[str]) -> _Fault | None:
        """Consume one use of the first fault for this endpoint, if it is of these kinds.
        Called with the lock held."""
        for fault in self._faults:
            if fault.matches(endpoint):
                if fault.kind not in kinds:
                    return None
                fault.remaining -= 1
                if fault.remaining == 0:
                    self._faults.remove(fault)
                return fault
        return None

    # --- the API ---------------------------------------------------------------------------

    def handle(self, request: RecordedRequest) -> _Reply:
        """Decide the answer to one request (called from a handler thread)."""
        with self._lock:
            self._requests.append(request)
            endpoint = _endpoint_of(request.path)
            if endpoint is None:
                return _Reply(404, {"code": "not_found", "message": "Invalid route"})
            if (request.method, endpoint) not in {
                ("POST", Endpoint.SEND),
                ("GET", Endpoint.LOOKUP),
            }:
                return _Reply(405, {"code": "method_not_allowed", "message": "Not allowed"})
            injected = self._take_fault(endpoint, {"respond"})
            if injected is not None:
                return _Reply(injected.status, injected.body, injected.headers)
            if request.headers.get("api-key") != self.api_key:
                return _Reply(401, {"code": "unauthorized", "message": "Key not found"})
            try:
                if endpoint is Endpoint.LOOKUP:
                    return _Reply(200, self._list(request.query))
                return self._send(request.json)
            except _InvalidRequest as exc:
                return _Reply(400, {"code": exc.code, "message": str(exc)})

    def _send(self, body: Json) -> _Reply:
        versions = _validate_send(body)
        for version in versions:
            for recipient in _recipients_of(body, version):
                reason = self._rejected_recipients.get(recipient["email"].lower())
                if reason is not None:
                    raise _InvalidRequest(reason)
        now = self.clock()
        key = (body.get("headers") or {}).get("idempotencyKey")
        if key is not None:
            seen = self._keys.get(key)
            if seen is not None and now - seen[0] < self.idempotency_window:
                if self.duplicate_key == "reject":
                    raise _InvalidRequest(
                        "A request with this idempotencyKey was already processed",
                        code="duplicate_parameter",
                    )
                return _Reply(201, _ids_body(body, seen[1]))
        ids = [self._accept(body, version, key, now) for version in versions]
        if key is not None:
            self._keys[key] = (now, ids)
        after = self._take_fault(Endpoint.SEND, {"hang", "drop"})
        return _Reply(201, _ids_body(body, ids), after_accept=after)

    def _accept(
        self, body: dict[str, Any], version: dict[str, Any], key: str | None, now: datetime
    ) -> str:
        message_id = f"<{now:%Y%m%d%H%M%S}.{next(self._counter):011d}@smtp-relay.mailin.fr>"
        headers = dict(body.get("headers") or {})
        self._deliveries.append(
            Delivery(
                message_id=message_id,
                uuid=str(uuid.uuid4()),
                sender=dict(body["sender"]),
                to=[dict(recipient) for recipient in version["to"]],
                subject=version.get("subject", body.get("subject", "")),
                html=version.get("htmlContent", body.get("htmlContent")),
                text=version.get("textContent", body.get("textContent")),
                headers={k: v for k, v in headers.items() if k != "idempotencyKey"},
                tags=list(body.get("tags") or []),
                idempotency_key=key,
                accepted_at=now,
                cc=[dict(recipient) for recipient in _field(body, version, "cc") or []],
                bcc=[dict(recipient) for recipient in _field(body, version, "bcc") or []],
                reply_to=_field(body, version, "replyTo"),
                attachments=[
                    ReceivedAttachment(
                        name=attachment.get("name") or attachment.get("url", ""),
                        content=(
                            base64.b64decode(attachment["content"])
                            if "content" in attachment
                            else None
                        ),
                        url=attachment.get("url"),
                    )
                    for attachment in body.get("attachment") or []
                ],
            )
        )
        return message_id

    def _list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        message_id = _one(query, "messageId")
        address = _one(query, "email")
        if message_id is None and address is None and _one(query, "templateId") is None:
            raise _InvalidRequest(
                "email, templateId or messageId is required", code="missing_parameter"
            )
        limit, offset = int(_one(query, "limit") or 500), int(_one(query, "offset") or 0)
        if not 0 <= limit <= 1000:
            raise _InvalidRequest("limit must be between 0 and 1000")
        records = [
            delivery.listed(recipient)
            for delivery in self._deliveries
            for recipient in delivery.recipient_emails
            if (message_id is None or delivery.message_id == message_id)
            and (address is None or recipient.lower() == address.lower())
        ]
        if _one(query, "sort") != "asc":
            records.reverse()  # Brevo lists newest first by default
        return {"count": len(records), "transactionalEmails": records[offset : offset + limit]}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the real API
    server: ThreadingHTTPServer

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        return None

    def _serve(self) -> None:
        brevo: BrevoServer = self.server.brevo  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            parsed: Json = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        url = urlsplit(self.path)
        request = RecordedRequest(
            method=self.command,
            path=url.path,
            query=parse_qs(url.query),
            headers={name.lower(): value for name, value in self.headers.items()},
            json=parsed,
        )
        reply = brevo.handle(request)
        fault = reply.after_accept
        if fault is not None and fault.kind == "drop":
            self.close_connection = True  # accepted, and no answer at all
            return
        if fault is not None and fault.kind == "hang":
            brevo._release.wait(fault.hang_seconds)
            self.close_connection = True
        self._write(reply)

    def _write(self, reply: _Reply) -> None:
        payload = json.dumps(reply.body).encode() if reply.body is not None else b""
        try:
            self.send_response(reply.status)
            self.send_header("content-type", "application/json; charset=utf-8")
            self.send_header("content-length", str(len(payload)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the client gave up (a held answer): nothing to tell
            self.close_connection = True


def _endpoint_of(path: str) -> Endpoint | None:
    return {SEND_PATH: Endpoint.SEND, LIST_PATH: Endpoint.LOOKUP}.get(path.rstrip("/"))


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _ids_body(body: dict[str, Any], ids: list[str]) -> dict[str, Any]:
    return {"messageIds": ids} if "messageVersions" in body else {"messageId": ids[0]}


def _field(body: dict[str, Any], version: dict[str, Any], name: str) -> Any:
    """A version's own `cc`, `bcc` or `replyTo`, else the call's (Brevo: "global
    parameters such as to, bcc, cc, replyTo, subject can be customized" per version)."""
    return version[name] if name in version else body.get(name)


def _recipients_of(body: dict[str, Any], version: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *version["to"],
        *(_field(body, version, "cc") or []),
        *(_field(body, version, "bcc") or []),
    ]


def _code_for(status: int) -> str:
    return {
        400: "invalid_parameter",
        401: "unauthorized",
        402: "not_enough_credits",
        403: "permission_denied",
        404: "document_not_found",
        422: "unprocessable_entity",
        429: "too_many_requests",
    }.get(status, "internal_error" if status >= 500 else "bad_request")


# --- Brevo's request schema -----------------------------------------------------------------
#
# `POST /v3/smtp/email` takes a `sendSmtpEmail`. The definitions below are written out from
# Brevo's published Swagger 2.0 file (Brevo API 3.0.0, as shipped in getbrevo/brevo-go
# `api/swagger.yaml`): the types, `required` lists and `format`s of `sendSmtpEmail` and the
# definitions it refers to. Rules that file states only in descriptions follow as code in
# `_validate_send` (subject and htmlContent mandatory without templateId, `to` mandatory
# without messageVersions, at most 99 recipients per version and 2000 per request).
# Stricter than Brevo on purpose: an unknown field is refused (Brevo ignores it), so a
# typo in the provider shows up here.

_NAME = {"type": "string", "maxLength": 70}  # "Maximum allowed characters are 70"
_ADDRESS = {
    "type": "object",
    "required": ["email"],
    "properties": {"email": {"type": "string", "format": "email"}, "name": _NAME},
}
_SENDER = {
    "type": "object",
    "properties": {
        "name": _NAME,
        "email": {"type": "string", "format": "email"},
        "id": {"type": "integer"},
    },
}
_ATTACHMENT = {
    "type": "object",
    "properties": {
        "url": {"type": "string", "format": "url"},
        "content": {"type": "string", "format": "byte"},  # base64, see _BASE64
        "name": {"type": "string"},
    },
}
# sendSmtpEmail_attachment.content's `pattern`: standard base64, padded, no line breaks.
_BASE64 = re.compile(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")
# "Allowed extensions for attachment file" (sendSmtpEmail.attachment).
# fmt: off
ATTACHMENT_EXTENSIONS = frozenset({
    "xlsx", "xls", "ods", "docx", "docm", "doc", "csv", "pdf", "txt", "gif", "jpg", "jpeg",
    "png", "tif", "tiff", "rtf", "bmp", "cgm", "css", "shtml", "html", "htm", "zip", "xml",
    "ppt", "pptx", "tar", "ez", "ics", "mobi", "msg", "pub", "eps", "odt", "mp3", "m4a",
    "m4v", "wma", "ogg", "flac", "wav", "aif", "aifc", "aiff", "mp4", "mov", "avi", "mkv",
    "mpeg", "mpg", "wmv", "pkpass", "xlsm",
})
# fmt: on
SEND_SMTP_EMAIL_VERSION: dict[str, Any] = {
    "type": "object",
    "required": ["to"],
    "properties": {
        "to": {"type": "array", "items": _ADDRESS},
        "params": {"type": "object"},
        "bcc": {"type": "array", "items": _ADDRESS},
        "cc": {"type": "array", "items": _ADDRESS},
        "replyTo": _ADDRESS,
        "subject": {"type": "string"},
        "htmlContent": {"type": "string"},
        "textContent": {"type": "string"},
    },
}
SEND_SMTP_EMAIL: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sender": _SENDER,
        "to": {"type": "array", "items": _ADDRESS},
        "bcc": {"type": "array", "items": _ADDRESS},
        "cc": {"type": "array", "items": _ADDRESS},
        "htmlContent": {"type": "string"},
        "textContent": {"type": "string"},
        "subject": {"type": "string"},
        "replyTo": _ADDRESS,
        "attachment": {"type": "array", "items": _ATTACHMENT},
        "headers": {"type": "object", "values": {"type": "string"}},
        "templateId": {"type": "integer"},
        "params": {"type": "object"},
        "messageVersions": {"type": "array", "items": SEND_SMTP_EMAIL_VERSION},
        "tags": {"type": "array", "items": {"type": "string"}},
        "scheduledAt": {"type": "string", "format": "date-time"},
        "batchId": {"type": "string"},
    },
}
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
}
# JSON Schema's `email` format is an RFC 5321 Mailbox: ASCII only (`idn-email` is the
# Unicode one). A dot-atom local part (mailbag never sends quoted ones) and a domain
# of LDH labels, punycode included.
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_EMAIL = re.compile(rf"{_ATEXT}(?:\.{_ATEXT})*@{_LABEL}(?:\.{_LABEL})+")


def _check(given: Json, schema: dict[str, Any], where: str) -> None:
    """Validate `given` against one of the definitions above; raise _InvalidRequest naming
    the first field that does not conform, the way Brevo answers (400)."""
    expected = schema["type"]
    if not isinstance(given, _TYPES[expected]) or isinstance(given, bool):
        raise _InvalidRequest(f"{where} must be of type {expected}")
    value: Any = given
    is_email = expected == "string" and schema.get("format") == "email"
    if is_email and (len(value) > 254 or not _EMAIL.fullmatch(value)):
        raise _InvalidRequest(f"email is not valid in {where}")
    if expected == "string" and len(value) > schema.get("maxLength", len(value)):
        raise _InvalidRequest(f"{where} is longer than {schema['maxLength']} characters")
    if expected == "string" and schema.get("format") == "byte":
        try:
            valid = bool(_BASE64.fullmatch(value)) and base64.b64decode(value, validate=True)
        except binascii.Error:
            valid = False
        if value and not valid:
            raise _InvalidRequest(f"{where} is not valid base64")
    if expected == "string" and schema.get("format") == "url":
        parts = urlsplit(value)
        if parts.scheme not in {"http", "https"} or not parts.netloc:
            raise _InvalidRequest(f"{where} must be an absolute URL")
    if expected == "string" and schema.get("format") == "date-time":
        try:
            datetime.fromisoformat(value)
        except ValueError:
            raise _InvalidRequest(f"{where} is not a date-time") from None
    if expected == "array":
        for index, item in enumerate(value):
            _check(item, schema["items"], f"{where}[{index}]")
    if expected == "object":
        for name in schema.get("required", ()):
            if name not in value:
                raise _InvalidRequest(f"{where}.{name} is missing", "missing_parameter")
        if "values" in schema:
            for key, item in value.items():
                _check(item, schema["values"], f"{where}.{key}")
        if "properties" in schema:
            unknown = set(value) - set(schema["properties"])
            if unknown:
                raise _InvalidRequest(f"{where}: unknown {sorted(unknown)}")
            for name, item in value.items():
                _check(item, schema["properties"][name], f"{where}.{name}")


def _validate_send(body: Json) -> list[dict[str, Any]]:
    """Check a send body the way Brevo does; return its versions (a single send is one
    version: its outer `to`). Raises _InvalidRequest."""
    if not isinstance(body, dict):
        raise _InvalidRequest("Input must be a JSON object")
    _check(body, SEND_SMTP_EMAIL, "body")
    sender = body.get("sender")
    if not isinstance(sender, dict) or "email" not in sender:
        raise _InvalidRequest("sender is missing or its email is not valid", "missing_parameter")
    if "templateId" not in body:
        if not body.get("subject"):
            raise _InvalidRequest("subject is missing", "missing_parameter")
        if not body.get("htmlContent") and not body.get("textContent"):
            raise _InvalidRequest("htmlContent or textContent is missing", "missing_parameter")
    headers = body.get("headers", {})
    if "idempotencyKey" in headers:
        try:
            uuid.UUID(headers["idempotencyKey"])
        except ValueError:
            raise _InvalidRequest("idempotencyKey must be a valid UUID") from None

    for number, attachment in enumerate(body.get("attachment", [])):
        _validate_attachment(attachment, f"attachment[{number}]")

    if "messageVersions" not in body:
        _validate_recipients(body.get("to"), "to")
        return [{"to": body["to"]}]
    if "to" in body:
        raise _InvalidRequest("to must not be passed with messageVersions")
    versions: list[dict[str, Any]] = body["messageVersions"]
    if not 1 <= len(versions) <= MAX_VERSIONS:
        raise _InvalidRequest(f"messageVersions must hold 1 to {MAX_VERSIONS} versions")
    total = 0
    for number, version in enumerate(versions):
        _validate_recipients(version.get("to"), f"messageVersions[{number}].to")
        count = len(_recipients_of(body, version))
        if count > MAX_RECIPIENTS_PER_VERSION:
            raise _InvalidRequest(f"messageVersions[{number}]: at most 99 recipients")
        total += count
    if total > MAX_RECIPIENTS_PER_CALL:
        raise _InvalidRequest(f"at most {MAX_RECIPIENTS_PER_CALL} recipients per request")
    return versions


def _validate_recipients(recipients: Json, where: str) -> None:
    if not isinstance(recipients, list) or not recipients:
        raise _InvalidRequest(f"{where} is missing or empty", "missing_parameter")


def _validate_attachment(attachment: dict[str, Any], where: str) -> None:
    """An attachment comes by `url` or base64 `content`; with content, a `name` is
    mandatory; either way the file's extension must be one Brevo allows."""
    if "content" not in attachment and "url" not in attachment:
        raise _InvalidRequest(f"{where}: url or content is required", "missing_parameter")
    if "content" in attachment and not attachment.get("name"):
        raise _InvalidRequest(f"{where}.name is required with content", "missing_parameter")
    name = attachment.get("name") or urlsplit(attachment["url"]).path
    _, dot, extension = name.rpartition(".")
    if not dot or extension.lower() not in ATTACHMENT_EXTENSIONS:
        raise _InvalidRequest(f"{where}: the file extension of {name!r} is not allowed")
