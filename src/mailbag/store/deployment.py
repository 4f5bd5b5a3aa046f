"""The deployment row: the secret key's check value, recorded once and compared at every
start of serve, api and worker (runtime.check_key)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import deployment
from mailbag.store.types import insert_into, insert_unless_taken

ROW_ID = 1


def record_key_check(key_check: str, now: datetime) -> Plan[None]:
    """Store the check value unless one is stored: replicas starting together on a new
    database all try, the first one's value stays."""
    dialect = yield from current_dialect()
    statement = insert_unless_taken(dialect, deployment, (deployment.c.id,))
    yield Step(statement.values(id=ROW_ID, key_check=key_check, created_at=now))


def replace_key_check(key_check: str, now: datetime) -> Plan[None]:
    """Store the check value in place of whatever is stored (the operator changed the key)."""
    dialect = yield from current_dialect()
    statement = insert_into(dialect, deployment).values(
        id=ROW_ID, key_check=key_check, created_at=now
    )
    if dialect == "mysql":
        yield Step(statement.on_duplicate_key_update(key_check=key_check, created_at=now))
    else:
        yield Step(
            statement.on_conflict_do_update(
                index_elements=[deployment.c.id],
                set_={"key_check": key_check, "created_at": now},
            )
        )


def stored_key_check() -> Plan[str | None]:
    row = (yield Step(select(deployment.c.key_check).where(deployment.c.id == ROW_ID))).first()
    return None if row is None else str(row.key_check)
