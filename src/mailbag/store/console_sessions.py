"""Console sessions: started at login, found on every request, deleted at logout."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, insert, select

from mailbag.store.plan import Plan, Step
from mailbag.store.schema import console_sessions as cs


def start(
    id_digest: str, password_fingerprint: str, *, now: datetime, expires_at: datetime
) -> Plan[None]:
    """A new session; expired ones are cleared on the way (logins are rare, rows few)."""
    yield Step(delete(cs).where(cs.c.expires_at <= now))
    yield Step(
        insert(cs).values(
            id_digest=id_digest,
            password_fingerprint=password_fingerprint,
            created_at=now,
            expires_at=expires_at,
        )
    )


def is_live(id_digest: str, password_fingerprint: str, *, now: datetime) -> Plan[bool]:
    """The session exists, has not expired, and began under the current password."""
    row = (
        yield Step(
            select(cs.c.id_digest).where(
                cs.c.id_digest == id_digest,
                cs.c.password_fingerprint == password_fingerprint,
                cs.c.expires_at > now,
            )
        )
    ).first()
    return row is not None


def end(id_digest: str) -> Plan[None]:
    yield Step(delete(cs).where(cs.c.id_digest == id_digest))
