"""Many rows into one table: one statement on PostgreSQL, an executemany elsewhere.

An executemany sends one INSERT per row (psycopg pipelines them, MariaDB's driver and
SQLite run them one by one). On PostgreSQL each of those is a statement of its own to
execute, and with ON CONFLICT a speculative insertion of its own: 1,000 rows cost about
as much server time as 1,000 requests. There the rows go in as one INSERT ... SELECT from
`jsonb_to_recordset` of one JSON document (orjson makes it in C; the server parses each
value into its column's type), planned once per table and column list. A row orjson
cannot write as JSON (an integer beyond 64 bits in template data) sends the chunk by the
executemany, whose column types write every value SQLAlchemy's way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import (
    JSON,
    Column,
    Dialect,
    Table,
    bindparam,
    column,
    func,
    insert,
    literal_column,
    select,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.dml import Insert
from sqlalchemy.types import TypeDecorator

from mailbag.store.plan import Step
from mailbag.store.types import insert_unless_taken

# (table, its columns given, the unique key a taken row is skipped on) -> the INSERT
_STATEMENTS: dict[tuple[str, tuple[str, ...], tuple[str, ...]], Insert] = {}


def insert_rows(
    dialect: str,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    *,
    unless_taken: Sequence[Column[Any]] | None = None,
) -> Step:
    """The Step that inserts `rows` (each with the same keys) into `table`; with
    `unless_taken`, a row whose unique key of these columns is taken is skipped, never an
    error (store.types.insert_unless_taken)."""
    if dialect == "postgresql":
        try:
            document = orjson.dumps(rows, default=_aware_time, option=_TIMES_OURS)
        except TypeError:
            pass  # the executemany below writes what orjson cannot
        else:
            statement = _recordset_insert(table, tuple(rows[0]), unless_taken)
            return Step(statement, {"rows": document})
    plain = (
        insert(table) if unless_taken is None else insert_unless_taken(dialect, table, unless_taken)
    )
    return Step(plain, list(rows))


class _Document(TypeDecorator[bytes]):
    """A JSON document serialized already, sent as a jsonb parameter. Not text cast to
    jsonb: the planner would parse that constant while planning, and the server again."""

    impl = postgresql.JSONB
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Any:
        from psycopg.types.json import Jsonb

        return lambda document: Jsonb(document, dumps=_as_is)


def _as_is(document: bytes) -> bytes:
    return document


# Times go through `_aware_time`, as they would through store.types.UTCDateTime.
_TIMES_OURS = orjson.OPT_PASSTHROUGH_DATETIME


def _aware_time(value: object) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("mailbag stores aware datetimes only")
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _recordset_insert(
    table: Table, names: tuple[str, ...], unless_taken: Sequence[Column[Any]] | None
) -> Insert:
    key = (table.name, names, tuple(c.name for c in unless_taken or ()))
    if (cached := _STATEMENTS.get(key)) is not None:
        return cached
    given = (
        func.jsonb_to_recordset(bindparam("rows", type_=_Document()))
        .table_valued(*(column(name, table.c[name].type) for name in names))
        .render_derived(name="given", with_types=True)
    )
    values = [_as_written(table.c[name], given.c[name]) for name in names]
    statement: Any = postgresql.insert(table).from_select(names, select(*values))
    if unless_taken is not None:
        statement = statement.on_conflict_do_nothing(index_elements=list(unless_taken))
    _STATEMENTS[key] = statement
    return statement  # type: ignore[no-any-return]


def _as_written(target: Column[Any], value: Any) -> Any:
    """A JSON null becomes SQL NULL in a record; a JSON column that stores Python None as
    JSON `null` (none_as_null False) gets that back."""
    if isinstance(target.type, JSON) and not target.type.none_as_null:
        return func.coalesce(value, literal_column("'null'::jsonb")).label(target.name)
    return value
