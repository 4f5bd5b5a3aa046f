"""A message's attachments in the console: the bytes of the preview's inline images."""

from __future__ import annotations

from collections.abc import Collection

from mailbag.console.context import Console
from mailbag.domain.content import AttachmentRef
from mailbag.store import attachments as attachment_store


async def contents(c: Console, refs: Collection[AttachmentRef]) -> dict[str, bytes]:
    """The bytes of these attachments by SHA-256 (one query; none when there are none)."""
    if not refs:
        return {}
    async with c.services.operations.db.connect(read_only=True) as tx:
        return await tx.run(attachment_store.contents({ref.sha256 for ref in refs}))
