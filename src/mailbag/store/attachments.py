"""Attachments: their bytes once per SHA-256 in `attachments`, and which message carries
which of them, in order and under which name, in `message_attachments`.

They are written in the enqueue's transaction (an outbox that loses an attachment has lost
the email). A bulk send of one PDF to 10,000 people stores its bytes once: the bytes go to
the database only when no row holds that digest yet.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, exists, func, insert, select, update

from mailbag.domain.content import Attachment, AttachmentRef
from mailbag.domain.message import Message
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import attachments as at
from mailbag.store.schema import message_attachments as ma
from mailbag.store.types import insert_into

_REF_COLUMNS = (ma.c.filename, ma.c.content_type, at.c.size, ma.c.sha256, ma.c.content_id)


def _ref(row: Any) -> AttachmentRef:
    return AttachmentRef(row.filename, row.content_type, row.size, row.sha256, row.content_id)


def store(carried: Mapping[uuid.UUID, Sequence[Attachment]], *, now: datetime) -> Plan[None]:
    """Write the attachments of new messages (by message id): each distinct content once,
    unless a row already holds it, then one reference row per message and position."""
    links = [
        {
            "message_id": message_id,
            "position": position,
            "sha256": item.sha256,
            "filename": item.filename,
            "content_type": item.content_type,
            "content_id": item.content_id,
        }
        for message_id, items in carried.items()
        for position, item in enumerate(items)
    ]
    if not links:
        return
    distinct = {item.sha256: item for items in carried.values() for item in items}
    # Shared locks on the contents already there: a concurrent purge cannot delete one of
    # them between this read and the references written below.
    present = set(
        (
            yield Step(
                select(at.c.sha256)
                .where(at.c.sha256.in_(list(distinct)))
                .with_for_update(read=True, key_share=True)
            )
        )
        .scalars()
        .all()
    )
    missing = [
        {"sha256": sha, "size": item.size, "content": item.content, "created_at": now}
        for sha, item in distinct.items()
        if sha not in present
    ]
    if missing:
        dialect = yield from current_dialect()
        # Another enqueue may be writing the same bytes right now: its row is as good.
        new_content = insert_into(dialect, at)
        if dialect == "mysql":
            new_content = new_content.on_duplicate_key_update(sha256=at.c.sha256)
            yield from _in_pieces(new_content, missing)
        else:
            new_content = new_content.on_conflict_do_nothing(index_elements=[at.c.sha256])
            yield Step(new_content, missing)
    yield Step(insert(ma), links)


# MariaDB takes a statement in one packet of at most max_allowed_packet (16 MiB by
# default), and the driver sends bytes escaped, up to twice their size: larger contents go
# in pieces of this many bytes.
MYSQL_PIECE = 4 * 1024 * 1024


def _in_pieces(new_content: Any, rows: list[dict[str, Any]]) -> Plan[None]:
    """Insert contents on MariaDB, each larger one as its first piece and then appends.

    An append applies only while the stored content is exactly as long as what came
    before it, so a concurrent enqueue of the same bytes (its INSERT waited for this row,
    then found it) appends nothing."""
    small = [row for row in rows if len(row["content"]) <= MYSQL_PIECE]
    if small:
        yield Step(new_content, small)
    for row in rows:
        content = row["content"]
        if len(content) <= MYSQL_PIECE:
            continue
        yield Step(new_content, {**row, "content": content[:MYSQL_PIECE]})
        for offset in range(MYSQL_PIECE, len(content), MYSQL_PIECE):
            yield Step(
                update(at)
                .where(at.c.sha256 == row["sha256"], func.length(at.c.content) == offset)
                .values(content=func.concat(at.c.content, content[offset : offset + MYSQL_PIECE]))
            )


def refs(message_ids: Sequence[uuid.UUID]) -> Plan[dict[uuid.UUID, tuple[AttachmentRef, ...]]]:
    """The attachments of these messages, in order, without their bytes (messages without
    any are left out)."""
    if not message_ids:
        return {}
    query = (
        select(ma.c.message_id, *_REF_COLUMNS)
        .join(at, at.c.sha256 == ma.c.sha256)
        .where(ma.c.message_id.in_(list(message_ids)))
        .order_by(ma.c.message_id, ma.c.position)
    )
    found: dict[uuid.UUID, list[AttachmentRef]] = defaultdict(list)
    for row in (yield Step(query)).all():
        found[row.message_id].append(_ref(row))
    return {message_id: tuple(items) for message_id, items in found.items()}


def attached(messages: list[Message]) -> Plan[list[Message]]:
    """These messages with their attachments' references filled in: one query, and none
    at all when no message carries any (most claims and pages)."""
    ids = [m.id for m in messages if m.attachment_count]
    if not ids:
        return messages
    carried = yield from refs(ids)
    return [replace(m, attachments=carried[m.id]) if m.id in carried else m for m in messages]


def contents(sha256s: Collection[str]) -> Plan[dict[str, bytes]]:
    """The bytes of these attachments, by SHA-256 (what a worker sends)."""
    if not sha256s:
        return {}
    query = select(at.c.sha256, at.c.content).where(at.c.sha256.in_(list(set(sha256s))))
    return {row.sha256: bytes(row.content) for row in (yield Step(query)).all()}


def content(message_id: uuid.UUID, position: int) -> Plan[tuple[AttachmentRef, bytes] | None]:
    """One attachment of a message with its bytes, by its index in the message (the
    console's download); None if the message has no such attachment."""
    query = (
        select(*_REF_COLUMNS, at.c.content)
        .join(at, at.c.sha256 == ma.c.sha256)
        .where(ma.c.message_id == message_id, ma.c.position == position)
    )
    row = (yield Step(query)).first()
    return (_ref(row), bytes(row.content)) if row is not None else None


def purge_unreferenced(limit: int = 1000) -> Plan[int]:
    """Delete up to `limit` attachments no message references any more.

    Callers repeat it until it returns less than `limit` (services.maintenance.purge). The
    DELETE checks again that nothing references a row, so content an enqueue has just
    linked to stays."""
    unreferenced = ~exists().where(ma.c.sha256 == at.c.sha256)
    candidates = select(at.c.sha256).where(unreferenced).limit(limit)
    shas = (yield Step(candidates)).scalars().all()
    if not shas:
        return 0
    result = yield Step(delete(at).where(and_(at.c.sha256.in_(shas), unreferenced)))
    return int(result.rowcount)  # type: ignore[attr-defined]
