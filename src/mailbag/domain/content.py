"""What one email can carry besides its template: recipients, attachments, a ready-made
body, and the limits on all of them. Pure data and checks; `message.new_message` applies
them to every new message."""

from __future__ import annotations

import hashlib
import mimetypes
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from enum import IntEnum
from functools import cached_property

import css_inline
from inscriptis import get_text

MIB = 1024 * 1024
FILENAME_MAX = 255
CONTENT_TYPE_MAX = 255
CONTENT_ID_MAX = 255
UNSUBSCRIBE_URL_MAX = 2000
BODY_MAX_BYTES = 2 * MIB  # each of html and text; they count toward the message total too

_CONTENT_TYPE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")
# A content id is an RFC 5322 msg-id's inside (dot-atom-text "@" dot-atom-text, or a bare
# dot-atom-text, which every mail client accepts): printable ASCII without specials.
_CONTENT_ID = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+(@[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+)?$")
# `cid:` references in HTML attributes (src, background, href) and in CSS url(...).
CID_REFERENCE = re.compile(r"""cid:([^"'\s)>]+)""", re.IGNORECASE)


@dataclass(frozen=True)
class Address:
    """One mailbox: a normalized address and an optional display name."""

    address: str
    name: str | None = None

    def as_json(self) -> dict[str, str]:
        return {"address": self.address, **({"name": self.name} if self.name else {})}

    @classmethod
    def from_json(cls, value: dict[str, str]) -> Address:
        return cls(value["address"], value.get("name") or None)


@dataclass(frozen=True)
class Recipients:
    """Who receives the message. `to` is never empty; Bcc goes into the envelope only."""

    to: tuple[Address, ...]
    cc: tuple[Address, ...] = ()
    bcc: tuple[Address, ...] = ()

    def __iter__(self) -> Iterator[Address]:
        return iter((*self.to, *self.cc, *self.bcc))

    def __len__(self) -> int:
        return len(self.to) + len(self.cc) + len(self.bcc)

    @property
    def envelope(self) -> list[str]:
        """Every address the email is delivered to (RCPT TO / Destinations), each once."""
        return list(dict.fromkeys(a.address for a in self))

    @property
    def is_single(self) -> bool:
        """Only one To and nothing else: the store keeps such a message in to_address alone."""
        return len(self.to) == 1 and not self.cc and not self.bcc

    def as_json(self) -> dict[str, list[dict[str, str]]]:
        return {
            "to": [a.as_json() for a in self.to],
            "cc": [a.as_json() for a in self.cc],
            "bcc": [a.as_json() for a in self.bcc],
        }

    @classmethod
    def from_json(cls, value: dict[str, list[dict[str, str]]]) -> Recipients:
        return cls(
            to=tuple(Address.from_json(a) for a in value.get("to", [])),
            cc=tuple(Address.from_json(a) for a in value.get("cc", [])),
            bcc=tuple(Address.from_json(a) for a in value.get("bcc", [])),
        )

    def without(self, dropped: set[str]) -> Recipients:
        """These recipients less the (lower-cased) addresses in `dropped`."""

        def keep(addresses: tuple[Address, ...]) -> tuple[Address, ...]:
            return tuple(a for a in addresses if a.address.lower() not in dropped)

        return Recipients(keep(self.to), keep(self.cc), keep(self.bcc))


@dataclass(frozen=True)
class AttachmentRef:
    """An attachment as a message references it: everything but the bytes."""

    filename: str
    content_type: str
    size: int
    sha256: str  # hex digest of the bytes: the key of the attachments table
    content_id: str | None = None  # set for an inline part, referenced as cid:<content_id>

    @property
    def inline(self) -> bool:
        return self.content_id is not None


@dataclass(frozen=True)
class Attachment:
    """An attachment with its bytes (what enqueue writes, and what a provider sends)."""

    filename: str
    content_type: str
    content: bytes
    content_id: str | None = None

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def size(self) -> int:
        return len(self.content)

    @property
    def inline(self) -> bool:
        return self.content_id is not None

    @property
    def ref(self) -> AttachmentRef:
        return AttachmentRef(
            self.filename, self.content_type, self.size, self.sha256, self.content_id
        )


@dataclass(frozen=True)
class Limits:
    """How much one message may carry (settings MAX_RECIPIENTS, MAX_ATTACHMENT_BYTES,
    MAX_MESSAGE_BYTES). The defaults fit SES's and Brevo's own limits."""

    max_recipients: int = 50
    max_attachment_bytes: int = 10 * MIB
    max_message_bytes: int = 10 * MIB  # attachments and bodies together, before encoding
    max_attachments: int = 20
    # What the configured provider cannot carry (its class's Capabilities; see
    # services.intake.limits), refused at enqueue rather than failed at send time.
    max_reply_to: int | None = None
    max_name_length: int | None = None  # of a recipient's or Reply-To's display name
    attachment_extensions: frozenset[str] | None = None  # lower case, without the dot
    provider: str | None = None  # only names the provider in error texts

    def extension_problem(self, filename: str) -> str | None:
        if self.attachment_extensions is None:
            return None
        extension = filename.rpartition(".")[2].lower() if "." in filename else ""
        if extension in self.attachment_extensions:
            return None
        return (
            f"has a file extension ({extension or 'none'}) the configured provider "
            f"({self.provider}) does not accept; it takes "
            + ", ".join(sorted(self.attachment_extensions))
        )


class Priority(IntEnum):
    """Which due message a worker claims first (see `HEAD_START`)."""

    LOW = -1
    NORMAL = 0
    HIGH = 1

    @classmethod
    def named(cls, name: str) -> Priority:
        return cls[name.upper()]

    @property
    def label(self) -> str:
        return self.name.lower()


# The claim rule, in full: among due messages, the one whose due time minus its head start
# is earliest goes first. A high-priority message is claimed before every normal one that
# became due less than HEAD_START before it; a low one waits behind normal ones that
# became due up to HEAD_START after it. No message ever waits behind one that became due
# more than 2 * HEAD_START after it, so a stream of high-priority mail cannot starve the rest.
HEAD_START = timedelta(minutes=5)


def head_start(priority: int) -> timedelta:
    return HEAD_START * priority


# Fair claiming (store/fair.py): due mail waits in lanes, one per tenant for its
# transactional mail and one for its bulk mail (message.NewMessage.bulk), and each claim
# shares its batch among the lanes with due mail by these weights; the claim rule above
# orders each lane. So one tenant's backlog cannot hold up another tenant's mail, and a
# transactional lane gets four times a bulk lane's share, while bulk mail always gets some.
TRANSACTIONAL_WEIGHT = 4
BULK_WEIGHT = 1


def content_type_problem(value: str) -> str | None:
    if not _CONTENT_TYPE.match(value) or len(value) > CONTENT_TYPE_MAX:
        return "must be a MIME type such as application/pdf (type/subtype, lower case)"
    return None


def content_id_problem(value: str) -> str | None:
    if not _CONTENT_ID.match(value) or len(value) > CONTENT_ID_MAX:
        return "must be printable ASCII without spaces, <, > or @ twice (e.g. logo or logo@acme)"
    return None


def cid_references(html: str) -> set[str]:
    """The content ids the HTML refers to as cid:..."""
    return {match.group(1) for match in CID_REFERENCE.finditer(html)}


def unresolved_cid(html: str, attachments: Iterable[Attachment | AttachmentRef]) -> str | None:
    """Why the HTML cannot show as meant, or None: a cid: it refers to that no attachment
    has (an inline image nobody attached would show broken)."""
    missing = cid_references(html) - {a.content_id for a in attachments if a.content_id}
    if not missing:
        return None
    return f"refers to cid:{sorted(missing)[0]}, and no attachment has that content_id"


def guess_content_type(filename: str) -> str:
    """The MIME type a file's name suggests, for callers that did not say."""
    return mimetypes.guess_type(filename)[0] or "application/octet-stream"


_INLINER = css_inline.CSSInliner(load_remote_stylesheets=False, keep_at_rules=True)


def inline_css(html: str) -> str:
    """The <style> rules moved into style attributes, as many mail clients need. Never
    fetches anything: a <link> stylesheet is dropped, not loaded (no request on enqueue)."""
    inlined: str = _INLINER.inline(html)
    return inlined


def text_from_html(html: str) -> str:
    """A plain-text alternative for a ready-made HTML body."""
    text: str = get_text(html)
    return text.strip() + "\n"
