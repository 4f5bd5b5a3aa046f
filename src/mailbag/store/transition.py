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

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Row, Table, and_, select, update

from mailbag.store.database import Dialect
from mailbag.store.plan import Plan, Step

# How many due rows a MariaDB claimer looks at for each row it wants: several claimers read
# the same head of the queue, and each locks what the others have not.
MYSQL_WINDOW = 4


def _mysql_lockable(
    table: Table,
    state: str,
    guard: ColumnElement[bool],
    order_by: Sequence[ColumnElement[Any]],
    limit: int,
) -> Plan[Any]:
    """MariaDB's SKIP LOCKED through a secondary index keeps its locks on the index entries
    of rows it skipped, so two claimers can deadlock on each other's index entries. So:
    read a window of due ids without locking, then lock among them by primary key only."""
    window = select(table.c.id).where(guard).limit(limit * MYSQL_WINDOW)
    if order_by:
        window = window.order_by(*order_by)
    ids = (yield Step(window)).scalars().all()
    return (
        select(table.c.id, table.c[state].label("previous_state"))
        .with_hint(table, "FORCE INDEX (PRIMARY)", "mysql")
        .where(table.c.id.in_(ids or [None]), guard)
        .order_by(table.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )


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
    log: Callable[[Any], Any] | None = None,
    columns: Sequence[str] | None = None,
) -> Plan[list[tuple[Row[Any], str]]]:
    """Apply `values` to the rows matching `guard`; return (new row, previous state) pairs.

    On PostgreSQL, `log` may turn the changed rows (a CTE with the table's columns and
    `previous_state`) into an INSERT that runs inside the same statement, so a state change
    and its history are one round trip. Elsewhere the caller writes the history itself.
    `columns` limits what comes back (all of the table's by default).
    """
    wanted = [table.c[name] for name in columns] if columns else list(table.c)
    key, state_column = table.c.id, table.c[state]
    candidates = select(key, state_column.label("previous_state")).where(guard)
    if order_by:
        candidates = candidates.order_by(*order_by)
    if limit is not None:
        candidates = candidates.limit(limit)

    if dialect == "postgresql":
        locked = candidates.with_for_update(skip_locked=skip_locked).cte("locked")
        changed = (
            update(table)
            .where(key == locked.c.id)
            .values(values)
            .returning(*wanted, locked.c.previous_state)
        )
        if log is None:
            rows = (yield Step(changed)).all()
        else:
            updated = changed.cte("updated")
            statement = select(updated).add_cte(log(updated).cte("logged"))
            rows = (yield Step(statement)).all()
        return [(row, row.previous_state) for row in rows]

    if dialect == "mysql" and skip_locked and limit is not None:
        candidates = yield from _mysql_lockable(table, state, guard, order_by, limit)
    elif dialect == "mysql":
        candidates = candidates.with_for_update()
    picked = (yield Step(candidates)).all()
    if not picked:
        return []
    previous = {row.id: row.previous_state for row in picked}
    if dialect == "mysql":
        # The rows are locked by the SELECT above, so the guard holds; and by primary key
        # only, lest InnoDB scan (and wait on) the other claimers' rows through an index.
        guarded = update(table).where(key.in_(list(previous))).values(values)
    else:
        guarded = update(table).where(and_(key.in_(list(previous)), guard)).values(values)
    if dialect == "sqlite":
        rows = (yield Step(guarded.returning(*wanted))).all()
    else:
        yield Step(guarded)
        rows = (yield Step(select(*wanted).where(key.in_(list(previous))))).all()
    return [(row, previous[row.id]) for row in rows]
