"""A new outbox message and the rules it must satisfy before anything is written."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from email_validator import EmailNotValidError, validate_email

# Column limits (the seed design's, plus the ones it left open). The schema uses the same names.
ADDRESS_MAX = 255
NAME_MAX = 255
SUBJECT_MAX = 500
TEMPLATE_NAME_MAX = 100
ERROR_MAX = 2000
IDEMPOTENCY_KEY_MAX = 255
TENANT_ID_MAX = 100
TAG_MAX = 100
TAGS_MAX = 20
HEADER_NAME_MAX = 100
HEADER_VALUE_MAX = 998  # RFC 5322's line limit
HEADERS_MAX = 50
TEMPLATE_DATA_MAX_BYTES = 64 * 1024

DEFAULT_TENANT = "default"

_HEADER_NAME = re.compile(r"^[!-9;-~]+$")  # RFC 5322 field name: printable ASCII but ':'
_TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
# Headers mailbag writes itself; letting a caller set them would break threading or delivery.
RESERVED_HEADERS = frozenset(
    {
        "to",
        "from",
        "subject",
        "message-id",
        "date",
        "mime-version",
        "content-type",
        "content-transfer-encoding",
        "bcc",
        "cc",
        "sender",
        "x-mailbag-message-id",
    }
)


class InvalidMessage(ValueError):
    """A message that must not be written. `errors` maps each field to what is wrong with it."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{name}: {problem}" for name, problem in self.errors.items()))


@dataclass(frozen=True)
class NewMessage:
    """A validated, normalized message, ready for the store. Build it with `new_message`."""

    to_address: str
    template_name: str
    template_data: Mapping[str, Any] = field(default_factory=dict)
    to_name: str | None = None
    from_address: str | None = None
    subject: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    tags: Sequence[str] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    tenant_id: str = DEFAULT_TENANT
    idempotency_key: str | None = None
    send_at: datetime | None = None
    max_attempts: int | None = None


def truncate_error(error: str | None) -> str | None:
    """last_error keeps at most ERROR_MAX characters; the tail of a long trace is dropped."""
    if error is None or len(error) <= ERROR_MAX:
        return error
    return error[: ERROR_MAX - 1] + "…"


def normalize_address(address: str) -> str:
    """Syntax check and normalization (domain lowercased, IDNA) without any DNS lookup."""
    if _has_line_break(address):
        raise EmailNotValidError("contains a line break")
    return validate_email(address, check_deliverability=False).normalized


def new_message(
    *,
    to: str,
    template: str,
    data: Mapping[str, Any] | None = None,
    to_name: str | None = None,
    from_address: str | None = None,
    subject: str | None = None,
    headers: Mapping[str, str] | None = None,
    tags: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    tenant_id: str = DEFAULT_TENANT,
    idempotency_key: str | None = None,
    send_at: datetime | None = None,
    max_attempts: int | None = None,
    known_templates: Collection[str] | None = None,
) -> NewMessage:
    """Validate and normalize every field, reporting all problems at once."""
    errors: dict[str, str] = {}

    def check_text(name: str, value: str | None, limit: int, *, header: bool = True) -> None:
        if value is None:
            return
        if not isinstance(value, str):
            errors[name] = "must be a string"
        elif header and _has_line_break(value):
            errors[name] = "must not contain CR, LF or NUL (header injection)"
        elif len(value) > limit:
            errors[name] = f"is {len(value)} characters; the limit is {limit}"

    to_address = _address("to", to, errors)
    sender = _address("from_address", from_address, errors) if from_address is not None else None
    check_text("to_name", to_name, NAME_MAX)
    check_text("subject", subject, SUBJECT_MAX)
    check_text("tenant_id", tenant_id, TENANT_ID_MAX)
    if not tenant_id:
        errors["tenant_id"] = "must not be empty"
    check_text("idempotency_key", idempotency_key, IDEMPOTENCY_KEY_MAX)
    if idempotency_key is not None and not idempotency_key.strip():
        errors["idempotency_key"] = "must not be blank"

    if not isinstance(template, str) or not _TEMPLATE_NAME.match(template):
        errors["template"] = "must be lowercase letters, digits, '-', '_' or '.'"
    elif len(template) > TEMPLATE_NAME_MAX:
        errors["template"] = f"is longer than {TEMPLATE_NAME_MAX} characters"
    elif known_templates is not None and template not in known_templates:
        errors["template"] = f"unknown template {template!r}"

    template_data = _json_object("data", data, errors, TEMPLATE_DATA_MAX_BYTES)
    meta = _json_object("metadata", metadata, errors, TEMPLATE_DATA_MAX_BYTES)
    clean_headers = _headers(headers or {}, errors)
    clean_tags = _tags(tags or (), errors)

    if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
        errors["max_attempts"] = "must be a positive integer"
    if send_at is not None and send_at.tzinfo is None:
        errors["send_at"] = "must carry a time zone"

    if errors:
        raise InvalidMessage(errors)
    return NewMessage(
        to_address=to_address,
        template_name=template,
        template_data=template_data,
        to_name=to_name or None,
        from_address=sender,
        subject=subject,
        headers=clean_headers,
        tags=clean_tags,
        metadata=meta,
        tenant_id=tenant_id,
        idempotency_key=idempotency_key,
        send_at=send_at,
        max_attempts=max_attempts,
    )


def _has_line_break(value: str) -> bool:
    return any(ch in value for ch in "\r\n\x00")


def _address(name: str, value: object, errors: dict[str, str]) -> str:
    if not isinstance(value, str):
        errors[name] = "must be a string"
        return ""
    if _has_line_break(value):
        errors[name] = "must not contain CR, LF or NUL (header injection)"
        return ""
    if len(value) > ADDRESS_MAX:
        errors[name] = f"is longer than {ADDRESS_MAX} characters"
        return ""
    try:
        return normalize_address(value)
    except EmailNotValidError as exc:
        errors[name] = f"is not a valid email address: {exc}"
        return ""


def _json_object(
    name: str, value: Mapping[str, Any] | None, errors: dict[str, str], max_bytes: int
) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errors[name] = "must be a JSON object"
        return {}
    try:
        encoded = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        errors[name] = f"is not JSON-serializable: {exc}"
        return {}
    if len(encoded.encode()) > max_bytes:
        errors[name] = f"is larger than {max_bytes} bytes as JSON"
        return {}
    # A round trip gives the plain JSON types the database will hand back.
    decoded: dict[str, Any] = json.loads(encoded)
    return decoded


def _headers(headers: Mapping[str, str], errors: dict[str, str]) -> dict[str, str]:
    if not isinstance(headers, Mapping):
        errors["headers"] = "must be an object of header names to values"
        return {}
    if len(headers) > HEADERS_MAX:
        errors["headers"] = f"at most {HEADERS_MAX} headers"
        return {}
    clean: dict[str, str] = {}
    for key, value in headers.items():
        if not isinstance(key, str) or not _HEADER_NAME.match(key) or len(key) > HEADER_NAME_MAX:
            errors["headers"] = f"invalid header name {key!r}"
        elif key.lower() in RESERVED_HEADERS:
            errors["headers"] = f"header {key!r} is set by mailbag"
        elif not isinstance(value, str):
            errors["headers"] = f"header {key!r} must have a string value"
        elif _has_line_break(value):
            errors["headers"] = f"header {key!r} must not contain CR, LF or NUL"
        elif len(value) > HEADER_VALUE_MAX:
            errors["headers"] = f"header {key!r} is longer than {HEADER_VALUE_MAX} characters"
        else:
            clean[key] = value
    return clean


def _tags(tags: Sequence[str], errors: dict[str, str]) -> list[str]:
    if isinstance(tags, str) or not isinstance(tags, Sequence):
        errors["tags"] = "must be a list of strings"
        return []
    if len(tags) > TAGS_MAX:
        errors["tags"] = f"at most {TAGS_MAX} tags"
        return []
    for tag in tags:
        if not isinstance(tag, str) or not tag or len(tag) > TAG_MAX or _has_line_break(tag):
            errors["tags"] = f"each tag is 1 to {TAG_MAX} characters without line breaks"
            return []
    return list(dict.fromkeys(tags))


@dataclass(frozen=True)
class Message:
    """A message as the store holds it (every column of outbox_messages)."""

    id: Any  # uuid.UUID
    tenant_id: str
    idempotency_key: str | None
    to_address: str
    to_name: str | None
    from_address: str | None
    subject: str | None
    template_name: str
    template_data: Mapping[str, Any]
    headers: Mapping[str, str]
    tags: Sequence[str]
    metadata: Mapping[str, Any]
    status: str
    attempt_count: int
    max_attempts: int
    next_attempt_at: datetime
    created_at: datetime
    updated_at: datetime
    claim_token: Any | None
    claimed_by: str | None
    claimed_at: datetime | None
    lease_expires_at: datetime | None
    provider: str | None
    provider_message_id: str | None
    last_error: str | None
    sent_at: datetime | None
    ambiguous_since: datetime | None

    @property
    def attempt(self) -> int:
        """The number of the attempt a claimed message is on (attempts count when finalized)."""
        return self.attempt_count + 1
