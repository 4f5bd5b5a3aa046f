"""A message's attachments in the console: their bytes for the preview's inline images,
and the operator's download.

A download is served from the console's own origin, so nothing in it may be rendered
there: it is always `Content-Disposition: attachment`, never sniffed, sandboxed by its
policy, and typed `application/octet-stream` unless its type is one a browser cannot run
(an uploaded text/html or SVG stays inert bytes).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection
from urllib.parse import quote

from starlette.responses import Response

from mailbag.console import render
from mailbag.console.context import Console, ConsoleError
from mailbag.console.forms import parse_id
from mailbag.domain.content import FILENAME_MAX, AttachmentRef
from mailbag.store import attachments as attachment_store

# Types a browser shows without running anything in the page's origin; every other type
# (text/html, image/svg+xml, application/xhtml+xml, text/xml, ...) is downloaded as bytes.
SAFE_TYPES = frozenset(
    {
        "application/pdf",
        "application/zip",
        "image/gif",
        "image/jpeg",
        "image/png",
        "image/webp",
        "text/csv",
        "text/plain",
    }
)
FALLBACK_TYPE = "application/octet-stream"
FALLBACK_NAME = "attachment"
_POSITION = re.compile(r"^[0-9]{1,4}$")
_UNQUOTED_ASCII = re.compile(r"[^A-Za-z0-9 !#$&+,.;=@^_`{}~()\[\]-]")


def download_type(content_type: str) -> str:
    return content_type if content_type in SAFE_TYPES else FALLBACK_TYPE


def safe_filename(filename: str) -> str:
    """The name a browser saves the file under: no directory, no control or format
    characters, no leading dots or spaces; `attachment` when nothing is left."""
    name = re.split(r"[/\\]", filename)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] not in "CZ" or ch == " ")
    name = name.strip(" .")[:FILENAME_MAX]
    return name or FALLBACK_NAME


def content_disposition(filename: str) -> str:
    """`attachment` with an ASCII fallback name and the exact one as RFC 6266's filename*."""
    name = safe_filename(filename)
    fallback = _UNQUOTED_ASCII.sub("_", name).strip(" .") or FALLBACK_NAME
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


async def download(c: Console) -> Response:
    """GET /admin/messages/{message_id}/attachments/{position}: the attachment's bytes."""
    message_id = parse_id(c.request.path_params["message_id"])
    raw_position = c.request.path_params["position"]
    found = None
    if message_id is not None and _POSITION.match(raw_position):
        async with c.services.operations.db.connect(read_only=True) as tx:
            found = await tx.run(attachment_store.content(message_id, int(raw_position)))
    if found is None:
        raise ConsoleError(404, "Not found", "This message has no attachment at this position.")
    ref, content = found
    return Response(
        content,
        headers={
            **render.DOWNLOAD_HEADERS,
            "Content-Type": download_type(ref.content_type),
            "Content-Disposition": content_disposition(ref.filename),
        },
    )


async def contents(c: Console, refs: Collection[AttachmentRef]) -> dict[str, bytes]:
    """The bytes of these attachments by SHA-256 (one query; none when there are none)."""
    if not refs:
        return {}
    async with c.services.operations.db.connect(read_only=True) as tx:
        return await tx.run(attachment_store.contents({ref.sha256 for ref in refs}))
