"""A message as its recipient would see it, with the secret template fields blanked out.

The HTML is shown in a sandboxed `srcdoc` frame (message.html): no scripts (no
allow-scripts), an opaque origin (no allow-same-origin), and the console's policy, which
the frame inherits, loads nothing but data: images. Its inline images are therefore
written into the HTML as data: URIs here; a remote image stays unloaded, as a tracking
pixel should.
"""

from __future__ import annotations

import base64
import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from mailbag.compose import compose
from mailbag.domain.content import CID_REFERENCE, Attachment, AttachmentRef
from mailbag.domain.message import Message
from mailbag.domain.verification import EmailReference
from mailbag.settings import Settings
from mailbag.templates import TemplateError
from mailbag.templates.book import Book

REDACTED = "[redacted]"
# Not shown: the MIME structure is noise, and Date would be the time of this preview.
_HIDDEN_HEADERS = frozenset({"mime-version", "content-type", "content-transfer-encoding", "date"})


@dataclass(frozen=True)
class Preview:
    headers: list[tuple[str, str]] = field(default_factory=list)
    html: str = ""
    text: str = ""
    error: str | None = None


def secret_fields(message: Message) -> frozenset[str]:
    named = message.metadata.get("secret_fields") if isinstance(message.metadata, dict) else None
    if not isinstance(named, list | tuple):
        return frozenset()
    return frozenset(name for name in named if isinstance(name, str))


def redacted_data(message: Message) -> dict[str, Any]:
    """Template data safe to show: a verification's token and link never reach the console."""
    secret = secret_fields(message)
    return {k: (REDACTED if k in secret else v) for k, v in message.template_data.items()}


def redacted_secrets(message: Message) -> dict[str, str | None]:
    """The fields a verification email renders with, its token blanked out: the preview
    shows the link's shape, never a token that would confirm."""
    reference = EmailReference.from_metadata(message.metadata)
    return reference.secrets(REDACTED) if reference else {}


def inline_images(message: Message) -> tuple[AttachmentRef, ...]:
    """The attachments the preview shows in place of their cid: references: inline images.
    Only their bytes are read for a preview, never those of the other attachments."""
    return tuple(ref for ref in message.attachments if ref.inline and _is_image(ref.content_type))


def _is_image(content_type: str) -> bool:
    return content_type.startswith("image/")


def with_inline_images(html: str, attachments: Sequence[Attachment]) -> str:
    """`html` with each cid: reference to an inline image replaced by its bytes as a data:
    URI; a reference to anything else is left as it is (and shows as a missing image)."""
    uris = {
        a.content_id: f"data:{a.content_type};base64,{base64.b64encode(a.content).decode()}"
        for a in attachments
        if a.content_id is not None and _is_image(a.content_type)
    }

    def replaced(match: re.Match[str]) -> str:
        cid = match.group(1)
        return uris.get(cid) or uris.get(unquote(cid)) or match.group(0)  # RFC 2392 %-encodes

    return CID_REFERENCE.sub(replaced, html) if uris else html


def preview(
    message: Message,
    book: Book,
    settings: Settings,
    now: datetime,
    contents: Mapping[str, bytes] | None = None,
) -> Preview:
    """`contents` holds the bytes of the message's inline images by SHA-256
    (`inline_images`); an image without its bytes is left out of the preview. `book` holds
    its template version (services.templates.Templates.hold)."""
    contents = contents or {}
    images = tuple(ref for ref in inline_images(message) if ref.sha256 in contents)
    safe = dataclasses.replace(message, template_data=redacted_data(message), attachments=images)
    try:
        email = compose(
            safe,
            book,
            default_from_email=settings.from_email,
            default_from_name=settings.from_name,
            message_id_domain=settings.message_id_host,
            now=now,
            secrets=redacted_secrets,
            contents=contents,
        )
        headers = [
            (name, str(value))
            for name, value in email.mime.items()
            if name.lower() not in _HIDDEN_HEADERS
        ]
    except (TemplateError, ValueError) as exc:  # ValueError: an address MIME cannot encode
        return Preview(error=f"{type(exc).__name__}: {exc}")
    return Preview(
        headers=headers, html=with_inline_images(email.html, email.attachments), text=email.text
    )
