"""The one mechanism every state change goes through, for messages and verifications alike.

`apply_transition` moves the rows of a `Tracked` table that an action allows, as the
domain's `Machine` says: the guard is the action's source states, the new state is its
target (or one `CASE` built from the transitions' conditions), and each move is recorded in
the table's history with the same transaction. It is a guarded UPDATE that reports, for
each row it changed, the row as it is now and the state it left.

Dialects differ here and nowhere else:

- PostgreSQL: `WITH locked AS (SELECT id, state ... FOR UPDATE [SKIP LOCKED]) UPDATE ...
  FROM locked RETURNING ...`, one statement;
- SQLite: the candidate SELECT and a conditional `UPDATE ... RETURNING` inside one
  BEGIN IMMEDIATE transaction (one writer at a time, so nothing runs in between);
- MariaDB/MySQL (no `UPDATE ... RETURNING`): `SELECT ... FOR UPDATE [SKIP LOCKED]`, the
  conditional `UPDATE` of the locked ids, then a read of the result, in one transaction.

On PostgreSQL the history rows are written by the same statement (a data-modifying CTE);
elsewhere by one executemany of one cached INSERT in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy import (
    ColumnElement,
    Executable,
    Insert,
    Row,
    Select,
    String,
    Table,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    literal_column,
    select,
    update,
)

from mailbag.domain.machine import Budget, Condition, Machine
from mailbag.domain.message import ERROR_MAX, truncate_error
from mailbag.store.bulk_insert import insert_rows
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.types import UTCDateTime

S = TypeVar("S", bound=StrEnum)
A = TypeVar("A", bound=StrEnum)

# How many due rows a MariaDB claimer looks at for each row it wants: several claimers read
# the same head of the queue, and each locks what the others have not.
MYSQL_WINDOW = 4


class Candidates(Protocol):
    """Which of the rows matching a guard a limited update takes, when that is more than
    the first in one order (store/fair.py: shared among lanes)."""

    def locked(self, guard: ColumnElement[bool], limit: int) -> Select[Any]:
        """PostgreSQL: (id, previous_state) of at most `limit` rows, locked as they are
        read (FOR UPDATE SKIP LOCKED), to be the statement's `locked` CTE."""
        ...

    def window(self, guard: ColumnElement[bool], limit: int, per_row: int) -> Plan[list[Row[Any]]]:
        """Elsewhere: (id, previous_state) of about `limit * per_row` rows, unlocked, the
        ones to take first first."""
        ...


def _mysql_lockable(
    table: Table,
    state: str,
    guard: ColumnElement[bool],
    order_by: Sequence[ColumnElement[Any]],
    limit: int,
    candidates: Candidates | None = None,
) -> Plan[list[Row[Any]]]:
    """MariaDB's SKIP LOCKED through a secondary index keeps its locks on the index entries
    of rows it skipped, so two claimers can deadlock on each other's index entries. So:
    read a window of due ids without locking, then lock among them by primary key only.

    The window is in `order_by` order and the locks go to its head: chunk by chunk, each
    chunk as large as what is still wanted, every unlocked row of a chunk is taken (so no
    row is locked and then left out). Locking `ORDER BY id LIMIT n` over the whole window
    would prefer the oldest ids (uuid7s: the first enqueued) to the window's order.
    `candidates` gives the window instead of `order_by`."""
    if candidates is not None:
        ids = [row.id for row in (yield from candidates.window(guard, limit, MYSQL_WINDOW))]
    else:
        window = select(table.c.id).where(guard).limit(limit * MYSQL_WINDOW)
        if order_by:
            window = window.order_by(*order_by)
        ids = list((yield Step(window)).scalars().all())
    picked: list[Row[Any]] = []
    while ids and len(picked) < limit:
        chunk, ids = ids[: limit - len(picked)], ids[limit - len(picked) :]
        lock = (
            select(table.c.id, table.c[state].label("previous_state"))
            .with_hint(table, "FORCE INDEX (PRIMARY)", "mysql")
            .where(table.c.id.in_(chunk), guard)
            .order_by(table.c.id)
            .with_for_update(skip_locked=True)
        )
        picked += (yield Step(lock)).all()
    return picked


def guarded_update(
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
    cache: Hashable | None = None,
    params: Mapping[str, Any] | None = None,
    candidates: Candidates | None = None,
) -> Plan[list[tuple[Row[Any], str]]]:
    """Apply `values` to the rows matching `guard`; return (new row, previous state) pairs.

    On PostgreSQL, `log` may turn the changed rows (a CTE with the table's columns and
    `previous_state`) into an INSERT that runs inside the same statement, so a state change
    and its history are one round trip. Elsewhere the caller writes the history itself.
    `columns` limits what comes back (all of the table's by default).

    `cache`: on PostgreSQL, the statement is built once for this key and reused, its
    values given by `params` at each run (a claim's statement and its history INSERT
    cost more to build than the 100 rows it claims cost to read). Only for callers whose
    guard, values and history carry nothing but named bind parameters besides what the
    key names: a literal would be frozen into every later run.

    `candidates` (with `limit` and `skip_locked`): which rows to take, instead of the
    first `limit` in `order_by` order.
    """
    dialect = yield from current_dialect()
    if dialect == "postgresql":
        statement = _STATEMENTS.get(cache) if cache is not None else None
        if statement is None:
            statement = _postgresql_update(
                table, state, guard, values, order_by, limit, skip_locked, log, columns, candidates
            )
            if cache is not None:
                _STATEMENTS[cache] = statement
        rows = (yield Step(statement, params)).all()
        return [(row, row[-1]) for row in rows]  # previous_state: RETURNING's last column

    wanted = [table.c[name] for name in columns] if columns else list(table.c)
    key, state_column = table.c.id, table.c[state]
    first = select(key, state_column.label("previous_state")).where(guard)
    if order_by:
        first = first.order_by(*order_by)
    if limit is not None:
        first = first.limit(limit)

    if dialect == "mysql" and skip_locked and limit is not None:
        picked = yield from _mysql_lockable(table, state, guard, order_by, limit, candidates)
    elif candidates is not None and limit is not None:  # SQLite: one writer, nothing locked
        picked = (yield from candidates.window(guard, limit, 1))[:limit]
    else:
        if dialect == "mysql":
            first = first.with_for_update()
        picked = list((yield Step(first)).all())
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


_STATEMENTS: dict[Hashable, Executable] = {}  # guarded_update's `cache`


def _postgresql_update(
    table: Table,
    state: str,
    guard: ColumnElement[bool],
    values: Mapping[str, Any],
    order_by: Sequence[ColumnElement[Any]],
    limit: int | None,
    skip_locked: bool,
    log: Callable[[Any], Any] | None,
    columns: Sequence[str] | None,
    candidates: Candidates | None = None,
) -> Executable:
    """`WITH locked AS (SELECT ... FOR UPDATE) UPDATE ... FROM locked RETURNING ...`, and
    the history INSERT from the changed rows in the same statement when `log` is given."""
    wanted = [table.c[name] for name in columns] if columns else list(table.c)
    key = table.c.id
    if candidates is not None and limit is not None:
        locked = candidates.locked(guard, limit).cte("locked")
    else:
        first = select(key, table.c[state].label("previous_state")).where(guard)
        if order_by:
            first = first.order_by(*order_by)
        if limit is not None:
            first = first.limit(limit)
        locked = first.with_for_update(skip_locked=skip_locked).cte("locked")
    changed = (
        update(table)
        .where(key == locked.c.id)
        .values(values)
        .returning(*wanted, locked.c.previous_state)
    )
    if log is None:
        return changed
    updated = changed.cte("updated")
    return select(updated).add_cte(log(updated).cte("logged"))


@dataclass(frozen=True)
class Tracked(Generic[S, A]):
    """A table whose rows move through a domain machine, and the table recording each move:
    (`subject`, from_<state>, to_<state>, at, actor, detail, and `copied` columns taken
    from the changed row; `counter` = (history column, row column) adds a count such as
    the attempt number)."""

    table: Table
    state: str
    machine: Machine[S, A]
    history: Table
    subject: str
    copied: Mapping[str, str] = field(default_factory=dict)
    counter: tuple[str, str] | None = None

    def in_states(self, states: Iterable[S]) -> ColumnElement[bool]:
        # Literals, not bound parameters: PostgreSQL can only match a partial index whose
        # predicate it can prove from the query text, including under generic prepared plans.
        column = self.table.c[self.state]
        return column.in_([_quoted(s) for s in sorted(states)])

    def target_sql(self, action: A) -> ColumnElement[Any]:
        """The state `action` moves a row to, in SQL, from the machine's table."""
        choices = self.machine.choices(action)
        if not choices:
            return _quoted(self.machine.target(action))
        whens = [(self._holds_sql(when), _quoted(state)) for when, state in choices]
        return case(*whens[:-1], else_=whens[-1][1])

    def _holds_sql(self, when: Condition) -> ColumnElement[bool]:
        """A transition's condition in SQL, of the row before the move (the state is the
        first column an UPDATE sets, so MariaDB's left-to-right SET sees the old values)."""
        c = self.table.c
        if isinstance(when, Budget):
            last = c[when.count] + 1 >= c[when.budget]
            return last if when.spent else c[when.count] + 1 < c[when.budget]
        return c[when.column] > 0 if when.positive else c[when.column] == 0


def _quoted(state: StrEnum) -> ColumnElement[Any]:
    return literal_column(f"'{state.value}'")


@dataclass(frozen=True)
class EventSpec:
    """What a history row says beyond from/to/at/actor, stated so that it can be computed in
    Python or in SQL from the changed row: detail = `text`, or the row's `column` between
    `prefix` and `suffix`; the counter (if the table has one) = the row's + `offset`."""

    offset: int = 0
    text: str | None = None
    column: str | None = None
    prefix: str = ""
    suffix: str = ""

    def detail(self, row: Mapping[Any, Any]) -> str | None:
        if self.column is None:
            return truncate_error(self.text)
        value = row[self.column]
        if value is None:
            return None if not self.prefix else f"{self.prefix}?{self.suffix}"
        return truncate_error(f"{self.prefix}{value}{self.suffix}")

    def detail_sql(self, row: Any, type_: Any) -> ColumnElement[Any]:
        if self.column is None:
            return literal(truncate_error(self.text), type_)
        value = row.c[self.column]
        if not self.prefix and not self.suffix:
            return func.substr(value, 1, ERROR_MAX)
        text = (
            literal(self.prefix, String())
            + func.coalesce(value, "?")
            + literal(self.suffix, String())
        )
        return func.substr(text, 1, ERROR_MAX)


def history_row(
    tracked: Tracked[Any, Any],
    row: Mapping[Any, Any],
    previous: str | None,
    *,
    at: datetime,
    actor: str,
    event: EventSpec,
) -> dict[str, Any]:
    """The history row of one move (or of a creation, `previous` None), in Python."""
    entry = {
        tracked.subject: row["id"],
        f"from_{tracked.state}": previous,
        f"to_{tracked.state}": row[tracked.state],
        "at": at,
        "actor": actor[:200],
        "detail": event.detail(row),
        **{column: row[source] for column, source in tracked.copied.items()},
    }
    if tracked.counter is not None:
        entry[tracked.counter[0]] = row[tracked.counter[1]] + event.offset
    return entry


def _history_sql(
    tracked: Tracked[Any, Any],
    updated: Any,
    *,
    at: datetime | ColumnElement[Any],
    actor: str | ColumnElement[Any],
    event: EventSpec,
) -> Insert:
    """The same history rows, as an INSERT ... SELECT from the changed rows' CTE."""
    h = tracked.history.c
    columns: dict[str, ColumnElement[Any]] = {
        tracked.subject: updated.c.id,
        f"from_{tracked.state}": updated.c.previous_state,
        f"to_{tracked.state}": updated.c[tracked.state],
        "at": at if isinstance(at, ColumnElement) else literal(at, h.at.type),
        "actor": actor if isinstance(actor, ColumnElement) else literal(actor[:200], String()),
        "detail": event.detail_sql(updated, h.detail.type),
        **{column: updated.c[source] for column, source in tracked.copied.items()},
    }
    if tracked.counter is not None:
        columns[tracked.counter[0]] = updated.c[tracked.counter[1]] + event.offset
    return insert(tracked.history).from_select(list(columns), select(*columns.values()))


def record(tracked: Tracked[Any, Any], rows: Sequence[Mapping[str, Any]]) -> Plan[None]:
    """Append history rows: one cached statement (store.bulk_insert), never one compiled
    anew for each batch."""
    if rows:
        dialect = yield from current_dialect()
        yield insert_rows(dialect, tracked.history, rows)


# A cached statement's time and actor (see apply_transition's `cache`).
NOW = bindparam("now", type_=UTCDateTime())
ACTOR = bindparam("actor", type_=String())


def apply_transition(
    tracked: Tracked[S, A],
    action: A,
    *,
    where: ColumnElement[bool],
    values: Mapping[str, Any],
    now: datetime,
    actor: str,
    order_by: Sequence[ColumnElement[Any]] = (),
    limit: int | None = None,
    skip_locked: bool = False,
    event: EventSpec = EventSpec(),
    columns: Sequence[str] | None = None,
    cache: Hashable | None = None,
    params: Mapping[str, Any] | None = None,
    candidates: Candidates | None = None,
) -> Plan[list[tuple[Row[Any], str]]]:
    """Move the rows matching `where` that `action` allows to the action's target, apply
    `values`, and record each move; return (row as it is now, state it left) pairs.

    `cache` and `params`: see `guarded_update`; here the time and actor become the bind
    parameters `now` and `actor` of a cached statement (the caller's guard and values may
    use `NOW` too)."""
    dialect = yield from current_dialect()
    cached = dialect == "postgresql" and cache is not None
    at: datetime | ColumnElement[Any] = NOW if cached else now
    by: str | ColumnElement[Any] = ACTOR if cached else actor
    changed = yield from guarded_update(
        tracked.table,
        state=tracked.state,
        guard=and_(tracked.in_states(tracked.machine.sources(action)), where),
        values={tracked.state: tracked.target_sql(action), "updated_at": at, **values},
        order_by=order_by,
        limit=limit,
        skip_locked=skip_locked,
        log=(
            (lambda updated: _history_sql(tracked, updated, at=at, actor=by, event=event))
            if dialect == "postgresql"
            else None
        ),
        columns=columns,
        cache=(tracked.table.name, action, event, tuple(columns or ()), cache) if cached else None,
        params={**(params or {}), "now": now, "actor": actor[:200]} if cached else params,
        candidates=candidates,
    )
    if changed and dialect != "postgresql":
        yield from record(
            tracked,
            [
                history_row(tracked, row._mapping, previous, at=now, actor=actor, event=event)
                for row, previous in changed
            ],
        )
    return changed
