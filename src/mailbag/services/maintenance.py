"""Housekeeping an operator runs (`mailbag purge`): old rows go, in short transactions.

Each chunk is its own transaction of at most CHUNK rows, repeated until a chunk comes back
short, so a large purge never holds locks for long. `unknown` messages are never purged.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from mailbag.store import attachments, idempotency, operator
from mailbag.store.plan import Plan
from mailbag.store.session import Database

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy import Engine

CHUNK = 1000


class Purged(NamedTuple):
    messages: int
    records: int  # expired idempotency records
    attachments: int  # attachment contents no message referenced any more


def purge(engine: Engine, *, older_than: datetime, now: datetime) -> Purged:
    """Delete finished messages last changed before `older_than`, every idempotency record
    expired by `now`, then the attachments no message references any more (those of the
    purged messages, unless another message carries the same bytes)."""
    messages = _in_chunks(engine, lambda: operator.purge(older_than=older_than, limit=CHUNK))
    records = _in_chunks(engine, lambda: idempotency.purge_expired(now, limit=CHUNK))
    unused = _in_chunks(engine, lambda: attachments.purge_unreferenced(limit=CHUNK))
    return Purged(messages, records, unused)


def _in_chunks(engine: Engine, chunk: Callable[[], Plan[int]]) -> int:
    db, total = Database(engine), 0
    while True:
        with db.transaction() as tx:
            deleted = tx.run(chunk())
        total += deleted
        if deleted < CHUNK:
            return total
