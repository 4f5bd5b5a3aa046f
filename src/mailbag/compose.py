"""Turn a stored message into the email a provider sends: render the template, build MIME.

Pure: no I/O. The `Message-ID` is derived from the message id, so it is the same on every
attempt and receivers, providers and reconciliation can all match it.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import SMTP
from email.utils import format_datetime
from functools import cached_property
from typing import Any
from urllib.parse import quote

from mailbag.domain import dkim
from mailbag.domain.bulk import UnsubscribeLinks, bulk_headers
from mailbag.domain.content import Address, Attachment, Recipients, unresolved_cid
from mailbag.domain.dkim import SigningKey
from mailbag.domain.message import (
    DEFAULT_TENANT,
    STRUCTURED_HEADERS,
    InvalidMessage,
    Message,
    NewMessage,
    ascii_address,
    ascii_domain,
)
from mailbag.templates import TemplateError
from mailbag.templates.book import Book

MESSAGE_ID_HEADER = "X-Mailbag-Message-ID"


def rfc_message_id(message_id: uuid.UUID, domain: str) -> str:
    return f"<{message_id}@{domain}>"


def message_id_from_rfc(value: str) -> uuid.UUID | None:
    """Our message id back from a Message-ID header we wrote, or None if it is not ours."""
    local = value.strip().strip("<>").split("@", 1)[0]
    try:
        return uuid.UUID(local)
    except ValueError:
        return None


class NeedsSMTPUTF8(ValueError):
    """An address has a non-ASCII local part: only an SMTPUTF8 (RFC 6532) message can carry
    it, and the caller asked for plain ASCII MIME."""


@dataclass(frozen=True)
class OutgoingEmail:
    """Everything a provider may need, as fields (for JSON APIs) and as MIME (for SMTP/raw)."""

    message_id: uuid.UUID
    attempt: int
    tenant_id: str
    from_email: str
    from_name: str | None
    recipients: Recipients  # Bcc: envelope only, never a header
    subject: str
    html: str
    text: str
    rfc_message_id: str
    date: datetime
    headers: Mapping[str, str] = field(default_factory=dict)
    tags: Sequence[str] = ()
    reply_to: Sequence[Address] = ()
    attachments: Sequence[Attachment] = ()  # inline ones (content_id set) are cid: images
    unsubscribe_url: str | None = None  # List-Unsubscribe + One-Click (RFC 8058)
    unsubscribe_mailto: str | None = None
    dkim: SigningKey | None = None  # the From domain's key: `raw` is signed with it

    @property
    def to_email(self) -> str:
        """The first To address (the one the store indexes and events are matched by)."""
        return self.recipients.to[0].address

    @property
    def to_name(self) -> str | None:
        return self.recipients.to[0].name

    @property
    def envelope_recipients(self) -> list[str]:
        """RCPT TO / Destinations: To, Cc and Bcc, each once."""
        return self.recipients.envelope

    @property
    def list_unsubscribe(self) -> dict[str, str]:
        """The List-Unsubscribe headers (RFC 2369, RFC 8058), in their wire form; empty when
        the message has no unsubscribe link."""
        targets = []
        if self.unsubscribe_url:
            targets.append(f"<{self.unsubscribe_url}>")
        if self.unsubscribe_mailto:
            # A URI is ASCII: a non-ASCII local part is percent-encoded UTF-8 (RFC 6068).
            local, _, domain = ascii_address(self.unsubscribe_mailto).rpartition("@")
            targets.append(f"<mailto:{quote(local, safe=_MAILTO_SAFE)}@{domain}>")
        if not targets:
            return {}
        headers = {"List-Unsubscribe": ", ".join(targets)}
        if self.unsubscribe_url:
            headers["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
        return headers

    @property
    def idempotency_key(self) -> str:
        """One key per attempt: a retry of the same attempt (after an ambiguous send) reuses
        it, a new attempt or an operator's requeue gets a new one."""
        return f"mailbag-{self.message_id}-{self.attempt}"

    @property
    def needs_smtputf8(self) -> bool:
        """An address's local part is not ASCII: only SMTPUTF8 can carry this email. Every
        address counts: From, To, Cc and Reply-To are headers, Bcc is in the envelope."""
        addresses = (self.from_email, *(a.address for a in (*self.recipients, *self.reply_to)))
        return not all(address.rpartition("@")[0].isascii() for address in addresses)

    @cached_property
    def raw(self) -> bytes:
        """The complete message as ASCII MIME with CRLF line endings, DKIM-signed when the
        From domain has a key (`dkim`). Raises NeedsSMTPUTF8 when an address cannot be
        written in ASCII (see `raw_utf8`)."""
        return self._signed(self._build(utf8=False))

    @cached_property
    def raw_utf8(self) -> bytes:
        """The message for an SMTPUTF8 transaction: addresses in UTF-8 (RFC 6532), the rest
        exactly as in `raw`."""
        return self._signed(self._build(utf8=True))

    def _signed(self, raw: bytes) -> bytes:
        """`raw` signed with the From domain's key. Providers ask for `raw` inside their
        send, where any exception means "it may have left" (`unknown`): a key dkimpy
        cannot sign with is a fault of the key, not of the send, so the email goes
        unsigned (SPF can still align it), logged and counted, and is never stuck."""
        if self.dkim is None:
            return raw
        try:
            return dkim.sign(raw, self.dkim)
        except Exception as exc:  # whatever dkimpy raises: never a send's fault
            from mailbag import log, metrics

            log.get("mailbag.compose").error(
                "dkim_signing_failed",
                domain=self.dkim.domain,
                selector=self.dkim.selector,
                error=type(exc).__name__,  # not its message: it may quote the key
            )
            metrics.DKIM_SIGNING_FAILED.inc()
            return raw

    @cached_property
    def mime(self) -> EmailMessage:
        """The message parsed back, for reading its headers (previews, tests)."""
        raw = self.raw_utf8 if self.needs_smtputf8 else self.raw
        message: EmailMessage = BytesParser(policy=SMTP).parsebytes(raw)
        return message

    def _build(self, *, utf8: bool) -> bytes:
        """MIME written out directly: every header from user text is encoded by `_text` or
        `_mailbox` so that decoding it gives that text back exactly (the email package's
        own header classes decode encoded-words found in their input, which let a subject
        of `=?utf-8?q?=0D=0A...?=` add headers). The body is a multipart/alternative of
        text and HTML, both quoted-printable UTF-8 (the text alone when there is no HTML);
        inline images wrap it in a multipart/related, other attachments in a
        multipart/mixed around that. Bcc is never written: it is envelope only."""
        boundary = f"=_mailbag_{self.message_id.hex}"  # "=_" never occurs in QP content
        lines = [
            _mailboxes("From", [Address(self.from_email, self.from_name)], utf8=utf8),
            _mailboxes("To", self.recipients.to, utf8=utf8),
        ]
        if self.recipients.cc:
            lines.append(_mailboxes("Cc", self.recipients.cc, utf8=utf8))
        if self.reply_to:
            lines.append(_mailboxes("Reply-To", self.reply_to, utf8=utf8))
        lines += [
            _text("Subject", self.subject),
            f"Date: {format_datetime(self.date)}",
            f"Message-ID: {self.rfc_message_id}",
            f"{MESSAGE_ID_HEADER}: {self.message_id}",
        ]
        own: set[str] = set()
        if self.list_unsubscribe:  # both headers are the fields' then, never a custom one
            own |= {"list-unsubscribe", "list-unsubscribe-post"}
        if self.reply_to:
            own.add("reply-to")
        for name, value in self.list_unsubscribe.items():
            lines.append(_list_header(name, value))
        for name, value in self.headers.items():
            if own and name.lower() in own:  # its own field wins (enqueue refuses both)
                continue
            structured = name.lower() in STRUCTURED_HEADERS
            lines.append(_literal(name, value) if structured else _text(name, value))
        if not self.attachments and self.html:  # the common case, kept as short as it was
            lines += [
                "MIME-Version: 1.0",
                f'Content-Type: multipart/alternative;\r\n boundary="{boundary}"',
                "",
            ]
            head = "\r\n".join(lines).encode("utf-8" if utf8 else "ascii")
            return b"".join(
                [
                    head,
                    _part(boundary, "plain", self.text),
                    _part(boundary, "html", self.html),
                    f"\r\n--{boundary}--\r\n".encode("ascii"),
                ]
            )
        headers, body = self._body(boundary)
        lines += ["MIME-Version: 1.0", headers, "", ""]
        return "\r\n".join(lines).encode("utf-8" if utf8 else "ascii") + body

    def _body(self, boundary: str) -> tuple[str, bytes]:
        """The content headers and the body of a message that is not the plain alternative:
        the text alone, or text and HTML with attachments. One boundary per level, none a
        prefix of another (some parsers match delimiter lines by prefix); "=_" occurs
        neither in quoted-printable nor in base64 content."""
        entity: tuple[str, bytes]
        if self.html:
            entity = (
                f'Content-Type: multipart/alternative;\r\n boundary="{boundary}"',
                _multipart(boundary, [_qp("plain", self.text), _qp("html", self.html)]),
            )
        else:  # ready-made text only: an empty HTML alternative would display as blank
            entity = _qp("plain", self.text)
        inline = [_attachment(a) for a in self.attachments if a.inline]
        if inline:
            related = f"=_mailbag_r_{self.message_id.hex}"
            first = "multipart/alternative" if self.html else "text/plain"
            entity = (
                f'Content-Type: multipart/related; type="{first}";\r\n boundary="{related}"',
                _multipart(related, [entity, *inline]),
            )
        regular = [_attachment(a) for a in self.attachments if not a.inline]
        if regular:
            mixed = f"=_mailbag_m_{self.message_id.hex}"
            entity = (
                f'Content-Type: multipart/mixed;\r\n boundary="{mixed}"',
                _multipart(mixed, [entity, *regular]),
            )
        return entity


def compose(
    message: Message,
    book: Book,
    *,
    default_from_email: str,
    default_from_name: str | None,
    message_id_domain: str,
    now: datetime,
    secrets: Callable[[Message], Mapping[str, Any]] | None = None,
    contents: Mapping[str, bytes] | None = None,
    signing: Mapping[tuple[str, str], SigningKey] | None = None,
    unsubscribe: UnsubscribeLinks | None = None,
) -> OutgoingEmail:
    """Render and assemble one email. Raises TemplateError when the template cannot render.

    `secrets` gives the template fields that are never stored (a verification's token and
    link): they join the data only here, for this rendering. `contents` holds the bytes
    of the message's attachments by SHA-256 (the store reads them with the claim).
    `signing`: the sender domains' keys by (tenant, domain); the From's signs the MIME.
    A bulk message (domain.bulk) gets its headers, and `unsubscribe`'s one-click link when
    it has no unsubscribe URL of its own."""
    contents = contents or {}
    if message.template_name is None:  # ready-made: checked and completed at enqueue
        subject, html, text = message.subject or "", message.html or "", message.text or ""
    else:
        data = {**message.template_data, **secrets(message)} if secrets else message.template_data
        rendered = book.render(
            message.template_name, data, message.subject, message.template_version_id
        )
        subject, html, text = rendered.subject, rendered.html, rendered.text
    from_email = message.from_address or default_from_email
    from_name = default_from_name if message.from_address is None else message.from_name
    headers, unsubscribe_url = dict(message.headers), message.unsubscribe_url
    if message.bulk:
        headers |= bulk_headers(headers, message.tenant_id, message.template_name)
        if unsubscribe_url is None and unsubscribe is not None:
            to = message.all_recipients.to[0].address  # the one the store indexes
            unsubscribe_url = unsubscribe.link(message.tenant_id, to, str(message.id))
    return OutgoingEmail(
        message_id=message.id,
        attempt=message.attempt,
        tenant_id=message.tenant_id,
        from_email=from_email,
        from_name=from_name,
        recipients=message.all_recipients,
        subject=subject,
        html=html,
        text=text,
        rfc_message_id=rfc_message_id(message.id, message_id_domain),
        date=now,
        headers=headers,
        tags=list(message.tags),
        reply_to=message.reply_to,
        attachments=tuple(
            Attachment(ref.filename, ref.content_type, contents[ref.sha256], ref.content_id)
            for ref in message.attachments
        ),
        unsubscribe_url=unsubscribe_url,
        unsubscribe_mailto=message.unsubscribe_mailto,
        dkim=(
            dkim.signing_key(signing, message.tenant_id, from_email, DEFAULT_TENANT)
            if signing
            else None
        ),
    )


def check_renders(message: NewMessage, book: Book, data: Mapping[str, Any]) -> None:
    """Render a new message once with `data` (its own, and any fields joined only at send
    time), with the version it is pinned to, before it is written: what would fail at send
    time -- a missing template variable, data that puts a line break into the subject -- is
    refused now (InvalidMessage) instead of ending `failed` later."""
    if message.template_name is None:
        return  # ready-made: new_message checked its cid: references already
    version_id = message.pin.version_id if message.pin else None
    try:
        rendered = book.render(message.template_name, data, message.subject, version_id)
    except TemplateError as exc:
        raise InvalidMessage({"template": f"does not render with this data: {exc}"}) from None
    if (problem := unresolved_cid(rendered.html, message.attachments)) is not None:
        raise InvalidMessage({"html": problem})


# --- writing headers ------------------------------------------------------------------
#
# Text goes out literally only when every decoder reads it back the same: printable ASCII
# words with single spaces, nothing that looks like an encoded-word. Anything else is
# written as RFC 2047 encoded-words, all of it, so that decoding yields exactly the input
# (whitespace between adjacent encoded-words is not part of the text).

LINE_SOFT_MAX = 78  # RFC 5322: lines SHOULD be at most 78 characters
LINE_HARD_MAX = 998  # ... and MUST be at most 998
ENCODED_WORD_MAX = 75  # RFC 2047
_WORD_OVERHEAD = len("=?utf-8?q??=")
_PLAIN = re.compile(r"[!-~]+(?: [!-~]+)*")
# Q-encoding may leave these as they are even inside a phrase (RFC 2047 section 5 (3)).
# A long URL is folded into pieces of this size (each on a line of its own).
_URL_PIECE = 900
# What a mailto: URI's local part keeps as it is besides letters, digits and "-._~"
# (RFC 6068's some-delims an addr-spec uses); everything else is percent-encoded UTF-8.
_MAILTO_SAFE = "!$'*+"
_Q_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!*+-/")


def _is_plain(value: str) -> bool:
    return "=?" not in value and _PLAIN.fullmatch(value) is not None


def _fold(name: str, tokens: Sequence[str]) -> str:
    """`Name: token token ...`, a line break (CRLF + the separating space) wherever the next
    token would pass 78 characters. Unfolding removes only the CRLF."""
    out, line = [f"{name}:"], len(name) + 1
    for token in tokens:
        if line + 1 + len(token) > LINE_SOFT_MAX and len(out) > 1:
            out.append("\r\n")
            line = 0
        out.append(" " + token)
        line += 1 + len(token)
    return "".join(out)


def _text(name: str, value: str) -> str:
    """An unstructured header (Subject, a custom X- header) that decodes to `value`."""
    if not value:
        return f"{name}:"
    words = value.split(" ")
    if _is_plain(value) and len(name) + 2 + max(len(w) for w in words) <= LINE_HARD_MAX:
        return _fold(name, words)
    return _fold(name, _encoded_words(value, first_line=len(name) + 2))


def _literal(name: str, value: str) -> str:
    """A structured header the caller wrote in its wire form (ASCII, checked at enqueue)."""
    return _fold(name, value.split(" ")) if _is_plain(value) else f"{name}: {value}"


def _mailbox(name: str, address: str, display_name: str | None, *, utf8: bool) -> str:
    """A header holding one mailbox."""
    return _fold(name, _mailbox_tokens(address, display_name, utf8=utf8, first_line=len(name) + 2))


def _mailboxes(name: str, mailboxes: Sequence[Address], *, utf8: bool) -> str:
    """A header holding a list of mailboxes (To, Cc, Reply-To), separated by commas and
    folded between words; one mailbox is written exactly as `_mailbox` writes it."""
    if len(mailboxes) == 1:
        return _mailbox(name, mailboxes[0].address, mailboxes[0].name, utf8=utf8)
    tokens: list[str] = []
    for index, mailbox in enumerate(mailboxes):
        first_line = len(name) + 2 if index == 0 else LINE_SOFT_MAX  # later: wherever it folds
        words = _mailbox_tokens(mailbox.address, mailbox.name, utf8=utf8, first_line=first_line)
        if index < len(mailboxes) - 1:
            words[-1] += ","  # after the <addr-spec>, never inside a phrase
        tokens += words
    return _fold(name, tokens)


def _mailbox_tokens(
    address: str, display_name: str | None, *, utf8: bool, first_line: int
) -> list[str]:
    local, _, domain = address.rpartition("@")
    if not local.isascii() and not utf8:
        raise NeedsSMTPUTF8(f"{address!r} has a non-ASCII local part; it needs SMTPUTF8")
    # Headers carry internationalized domains in their ASCII (IDNA) form.
    addr_spec = f"<{local}@{ascii_domain(domain)}>"
    if not display_name:
        return [addr_spec]
    if _is_plain(display_name):
        # A quoted-string, folded at its own single spaces if long: unfolding restores it.
        quoted = '"' + display_name.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return [*quoted.split(" "), addr_spec]
    # Adjacent encoded-words decode with no space between them (RFC 2047 6.2); the email
    # package's phrase parser keeps one, so only a name longer than one word differs there.
    return [*_encoded_words(display_name, first_line=first_line), addr_spec]


def _list_header(name: str, value: str) -> str:
    """List-Unsubscribe(-Post) as `list_unsubscribe` gives it, folded after its commas. A
    URL too long for one line (998) is folded inside its angle brackets, where RFC 2369
    says whitespace is ignored."""
    tokens = []
    for token in value.split(" "):
        while len(token) > LINE_HARD_MAX - len(name) - 2:
            tokens.append(token[:_URL_PIECE])
            token = token[_URL_PIECE:]
        tokens.append(token)
    return _fold(name, tokens)


def _encoded_words(value: str, *, first_line: int) -> list[str]:
    """`value` as UTF-8 encoded-words of at most 75 characters each, the first one short
    enough to follow `first_line` characters within 78 when it can; split between
    characters (never inside one), Q or B encoding whichever is shorter."""
    data = value.encode("utf-8")
    q_length = sum(1 if byte in _Q_SAFE or byte == 0x20 else 3 for byte in data)
    use_q = q_length <= 4 * -(-len(data) // 3)
    full = ENCODED_WORD_MAX - _WORD_OVERHEAD
    room = min(full, LINE_SOFT_MAX - first_line - _WORD_OVERHEAD)
    if room < 16:  # a very long header name: the first word goes on its long line anyway
        room = full
    words: list[str] = []
    chunk: list[bytes] = []
    size = 0
    for char in value:
        encoded = char.encode("utf-8")
        if use_q:
            cost = sum(1 if byte in _Q_SAFE or byte == 0x20 else 3 for byte in encoded)
            fits = size + cost <= room
        else:
            cost = len(encoded)
            fits = 4 * -(-(size + cost) // 3) <= room
        if not fits and chunk:
            words.append(_encoded_word(b"".join(chunk), use_q))
            chunk, size, room = [], 0, full
        chunk.append(encoded)
        size += cost
    words.append(_encoded_word(b"".join(chunk), use_q))
    return words


def _encoded_word(data: bytes, use_q: bool) -> str:
    if not use_q:
        return f"=?utf-8?b?{base64.b64encode(data).decode('ascii')}?="
    text = "".join(
        chr(byte) if byte in _Q_SAFE else "_" if byte == 0x20 else f"={byte:02X}" for byte in data
    )
    return f"=?utf-8?q?{text}?="


def _part(boundary: str, subtype: str, body: str) -> bytes:
    """One alternative: its headers and its body, quoted-printable UTF-8, CRLF lines."""
    headers, encoded = _qp(subtype, body)
    return f"\r\n--{boundary}\r\n{headers}\r\n\r\n".encode("ascii") + encoded


def _qp(subtype: str, body: str) -> tuple[str, bytes]:
    """A text entity: its headers and its body, quoted-printable UTF-8 with CRLF lines."""
    normalized = body.replace("\r\n", "\n").replace("\r", "\n").encode("utf-8")
    encoded = binascii.b2a_qp(normalized, quotetabs=False, istext=True, header=False)
    headers = (
        f'Content-Type: text/{subtype}; charset="utf-8"\r\n'
        "Content-Transfer-Encoding: quoted-printable"
    )
    return headers, encoded.replace(b"\n", b"\r\n")


def _multipart(boundary: str, entities: Sequence[tuple[str, bytes]]) -> bytes:
    """A multipart body: each entity (headers, blank line, body) after a delimiter line."""
    out = []
    for index, (headers, body) in enumerate(entities):
        delimiter = f"--{boundary}" if index == 0 else f"\r\n--{boundary}"
        out += [f"{delimiter}\r\n{headers}\r\n\r\n".encode("ascii"), body]
    out.append(f"\r\n--{boundary}--\r\n".encode("ascii"))
    return b"".join(out)


def _attachment(attachment: Attachment) -> tuple[str, bytes]:
    """An attachment entity: base64 in lines of 76 characters (RFC 2045), an inline one
    with its Content-ID for cid: references."""
    headers = [
        f"Content-Type: {attachment.content_type}",
        "Content-Transfer-Encoding: base64",
    ]
    if attachment.content_id is not None:
        headers.append(f"Content-ID: <{attachment.content_id}>")
    disposition = "inline" if attachment.inline else "attachment"
    headers.append(_disposition(disposition, attachment.filename))
    body = base64.encodebytes(attachment.content).rstrip(b"\n").replace(b"\n", b"\r\n")
    return "\r\n".join(headers), body


# RFC 2231 continuations stay within 78 characters with this much of the encoded value each.
_CONTINUATION_CHUNK = 60
_PERCENT_ESCAPE = re.compile(r"%[0-9A-F]{2}|[^%]")


def _disposition(kind: str, filename: str) -> str:
    """`Content-Disposition: kind; filename=...`: a quoted-string when the name is plain
    ASCII (quotes and backslashes escaped), else RFC 2231 (UTF-8, percent-encoded; also
    for a name that looks like an encoded-word, which readers would decode), split into
    continuations when long, so the name reads back exactly."""
    if _is_plain(filename) and len(filename) <= _CONTINUATION_CHUNK:
        return f'Content-Disposition: {kind};\r\n filename="{email.utils.quote(filename)}"'
    encoded = email.utils.encode_rfc2231(filename, "utf-8")
    if len(encoded) <= _CONTINUATION_CHUNK:
        return f"Content-Disposition: {kind};\r\n filename*={encoded}"
    chunks, chunk = [], ""
    for piece in _PERCENT_ESCAPE.findall(encoded):  # never split a %XX escape
        if len(chunk) + len(piece) > _CONTINUATION_CHUNK:
            chunks.append(chunk)
            chunk = ""
        chunk += piece
    chunks.append(chunk)
    params = ";\r\n".join(f" filename*{i}*={chunk}" for i, chunk in enumerate(chunks))
    return f"Content-Disposition: {kind};\r\n{params}"
