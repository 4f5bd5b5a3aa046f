"""The one mechanism every state change goes through: a guarded UPDATE that reports, for
each row it changed, the row as it is now and the state it left.

Dialects differ here and nowhere else:

- PostgreSQL: `WITH locked AS (SELECT id, state ... FOR UPDATE [SKIP LOCKED]) UPDATE ...
  FROM locked RETURNING ...`, one statement;
- SQLite: the candidate SELECT and a conditional `UPDATE ... RETURNING` inside one
  BEGIN IMMEDIATE transaction (one writer at a time, so nothing runs in between);
- MariaDB/MySQL (no `UPDATE ... RETURNING`): `SELECT ... FOR UPDATE [SKIP LOCKED]`, the
  conditional `UPDATE` of the locked ids, then a read of the result, in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Row, Table, and_, select, update

from mailbag.store.database import Dialect
from mailbag.store.plan import Plan, Step


def guarded_update(
    dialect: Dialect,
    table: Table,
    *,
    state: str,
    guard: ColumnElement[bool],
    values: Mapping[str, Any],
    order_by: Sequence[ColumnElement[Any]] = (),
    limit: int | None = None,
    skip_locked: bool = False,
) -> Plan[list[tuple[Row[Any], str]]]:
    """Apply `values` to the rows matching `guard`; return (new row, previous state) pairs."""
    key, state_column = table.c.id, table.c[state]
    candidates = select(key, state_column.label("previous_state")).where(guard)
    if order_by:
        candidates = candidates.order_by(*order_by)
    if limit is not None:
        candidates = candidates.limit(limit)

    if dialect == "postgresql":
        locked = candidates.with_for_update(skip_locked=skip_locked).cte("locked")
        statement = (
            update(table)
            .where(key == locked.c.id)
            .values(values)
            .returning(*table.c, locked.c.previous_state)
        )
        rows = (yield Step(statement)).all()
        return [(row, row.previous_state) for row in rows]

    if dialect == "mysql":
        candidates = candidates.with_for_update(skip_locked=skip_locked)
    picked = (yield Step(candidates)).all()
    if not picked:
        return []
    previous = {row.id: row.previous_state for row in picked}
    guarded = update(table).where(and_(key.in_(list(previous)), guard)).values(values)
    if dialect == "sqlite":
        rows = (yield Step(guarded.returning(*table.c))).all()
    else:
        yield Step(guarded)
        rows = (yield Step(select(*table.c).where(key.in_(list(previous))))).all()
    return [(row, previous[row.id]) for row in rows]
