"""A Django EmailMessage as mailbag's `new_message` fields: one table of what maps where,
and a clear InvalidMessage for what mailbag cannot carry (nothing is dropped silently).

- to, cc, bcc, reply_to: each item one mailbox, "Name <addr>" or "addr";
- from_email -> from_address and from_name, except mailbag's own FROM_EMAIL (with no name
  or FROM_NAME; both default to DEFAULT_FROM_EMAIL's): that one is left to the worker, so
  it needs no sender identity. Any other From (the same address under another name too)
  must be a sender identity of the tenant (`mailbag tenants senders add`);
- subject; body -> text, or html when `content_subtype` is "html";
- alternatives: one text/html (-> html), or a text/plain beside an HTML body (-> text);
  other types (text/calendar, AMP) are refused;
- attachments: (filename, content, mimetype) tuples and MIME parts; a part with a
  Content-ID is an inline one (referenced from the HTML as cid:...); multipart parts are
  refused;
- extra_headers: passed on (List-Unsubscribe, In-Reply-To, X-...), mailbag refusing the
  ones it writes itself (Message-ID, Date, ...). "From" and "Reply-To" there replace
  from_email and reply_to, as Django does; "To" and "Cc" there are refused (Django would
  show them without sending to them; mailbag sends to whom it shows). "Idempotency-Key"
  is not sent: it is the message's idempotency key in the outbox;
- attributes mailbag reads when a message has them (anymail's names where it has them):
  `tags`, `metadata`, `send_at`, `expires_at`, `priority`.

The message's `encoding` and `mixed_subtype` are not used: mailbag composes the MIME itself.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Iterable
from email.message import Message
from email.utils import getaddresses
from typing import Any

from mailbag.domain.content import Address, Attachment, guess_content_type
from mailbag.domain.message import InvalidMessage

IDEMPOTENCY_HEADER = "idempotency-key"
# Attributes of an EmailMessage that are passed to new_message as they are.
ATTRIBUTES = ("tags", "metadata", "send_at", "expires_at", "priority")
_REFUSED_HEADERS = {
    "to": "give recipients as to=[...]; a To header differing from them is not supported",
    "cc": "give copies as cc=[...]; a Cc header differing from them is not supported",
}


def message_fields(message: Any, *, tenant: str, default_from: Address) -> dict[str, Any]:
    """`new_message` keyword arguments for one Django EmailMessage (InvalidMessage when
    something in it cannot be carried). `default_from` is mailbag's FROM_EMAIL and
    FROM_NAME."""
    errors: dict[str, str] = {}
    headers: dict[str, str] = {}
    idempotency_key = None
    from_email = message.from_email
    reply_to = list(message.reply_to or ())
    for name, value in (message.extra_headers or {}).items():
        lowered = str(name).lower()
        if lowered == IDEMPOTENCY_HEADER:
            idempotency_key = str(value)
        elif lowered == "from":
            from_email = str(value)
        elif lowered == "reply-to":
            reply_to = [str(value)]
        elif lowered in _REFUSED_HEADERS:
            errors["headers"] = f"{name}: {_REFUSED_HEADERS[lowered]}"
        else:
            headers[str(name)] = str(value)

    fields: dict[str, Any] = {
        "tenant_id": tenant,
        "to": _mailboxes("to", message.to, errors),
        "cc": _mailboxes("cc", message.cc, errors),
        "bcc": _mailboxes("bcc", message.bcc, errors),
        "reply_to": _mailboxes("reply_to", reply_to, errors, several=True),
        "subject": str(message.subject),
        "headers": headers,
        "idempotency_key": idempotency_key,
        "attachments": _attachments(message.attachments, errors),
    }
    fields.update(_sender(from_email, default_from, errors))
    fields.update(_bodies(message, errors))
    for attribute in ATTRIBUTES:
        value = getattr(message, attribute, None)
        if value is not None:
            fields[attribute] = value
    if errors:
        raise InvalidMessage(errors)
    return fields


def _mailboxes(
    field: str, values: Iterable[Any], errors: dict[str, str], *, several: bool = False
) -> list[Address]:
    """Each value one mailbox ("Name <addr>" or "addr"); with `several`, a header-style list
    of them ("a@x, B <b@x>", as a Reply-To header holds)."""
    found: list[Address] = []
    for value in values or ():
        parsed = getaddresses([str(value)])
        if (
            not parsed
            or not all(address for _, address in parsed)
            or (len(parsed) > 1 and not several)
        ):
            kind = "email addresses" if several else "one email address"
            errors[field] = f"{str(value)!r} is not {kind}"
            continue
        found.extend(Address(address, name or None) for name, address in parsed)
    return found


def _sender(from_email: Any, default: Address, errors: dict[str, str]) -> dict[str, Any]:
    if not from_email:
        return {}
    found = _mailboxes("from", [from_email], errors)
    if not found:
        return {}
    sender = found[0]
    if sender.address.lower() == default.address.lower() and sender.name in (None, default.name):
        return {}  # the deployment's own FROM_EMAIL and FROM_NAME, filled in by the worker
    return {"from_address": sender.address, "from_name": sender.name}


def _bodies(message: Any, errors: dict[str, str]) -> dict[str, str | None]:
    body = str(message.body) if message.body is not None else ""
    html = body if message.content_subtype == "html" else None
    text = None if html is not None else body
    for content, mimetype in getattr(message, "alternatives", None) or ():
        value = content.decode() if isinstance(content, bytes) else str(content)
        if mimetype == "text/html" and html is None:
            html = value
        elif mimetype == "text/plain" and not text:
            text = value
        else:
            what = (
                f"a second {mimetype} body"
                if mimetype in ("text/html", "text/plain")
                else f"a {mimetype} alternative"
            )
            errors["alternatives"] = (
                f"{what} is not supported: mailbag sends one text/plain and one text/html body"
            )
    if html is not None and not text:
        text = None  # generated from the HTML by mailbag
    return {"html": html, "text": text}


def _attachments(items: Iterable[Any], errors: dict[str, str]) -> list[Attachment]:
    found = []
    for item in items or ():
        if isinstance(item, Message):
            attachment = _mime_part(item, errors)
        else:
            filename, content, mimetype = item
            attachment = Attachment(
                filename or _made_up_name(None, mimetype or "application/octet-stream"),
                mimetype or guess_content_type(filename or ""),
                _bytes(content),
            )
        if attachment is not None:
            found.append(attachment)
    return found


def _mime_part(part: Message, errors: dict[str, str]) -> Attachment | None:
    if part.is_multipart():
        errors["attachments"] = (
            f"a {part.get_content_type()} attachment is not supported: attach its files"
        )
        return None
    content_id = part.get("Content-ID")
    cid = str(content_id).strip().strip("<>") if content_id else None
    content_type = part.get_content_type()
    payload = part.get_payload(decode=True)
    return Attachment(
        part.get_filename() or _made_up_name(cid, content_type),
        content_type,
        payload if isinstance(payload, bytes) else b"",
        cid,
    )


def _bytes(content: Any) -> bytes:
    if isinstance(content, bytes):
        return content
    if isinstance(content, Message):
        return content.as_bytes()
    if hasattr(content, "message"):  # a Django EmailMessage attached as message/rfc822
        return bytes(content.message().as_bytes())
    return str(content).encode()


def _made_up_name(content_id: str | None, content_type: str) -> str:
    """A filename for a part that has none (an inline MIMEImage often has only a cid)."""
    stem = (content_id or "attachment").partition("@")[0] or "attachment"
    return stem + (mimetypes.guess_extension(content_type) or "")
