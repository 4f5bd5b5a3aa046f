"""Column types, and the INSERTs that tolerate a taken key, that behave the same on SQLite,
PostgreSQL and MariaDB."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    ARRAY,
    JSON,
    BigInteger,
    Column,
    DateTime,
    Dialect,
    Integer,
    LargeBinary,
    Table,
    Text,
    any_,
    bindparam,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.types import TypeDecorator, TypeEngine


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in Python; timestamptz on PostgreSQL, naive UTC elsewhere.

    SQLite and MariaDB DATETIME keep no zone, so values go in as naive UTC and come back
    tagged as UTC. Microseconds are kept everywhere (DATETIME(6) on MariaDB) so ordering by
    time is exact.
    """

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.TIMESTAMP(timezone=True))
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("mailbag stores aware datetimes only")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        # One call per value instead of TypeDecorator's wrapper around this (nine such
        # columns in every claimed row); the impl's own drivers need no processor.
        if self.impl_instance.result_processor(dialect, coltype) is not None:
            return super().result_processor(dialect, coltype)
        return _as_utc

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None or value.tzinfo is UTC:
            return value
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _as_utc(value: datetime | None) -> datetime | None:
    """UTCDateTime.process_result_value, for any dialect."""
    if value is None or value.tzinfo is UTC:
        return value
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def long_json() -> TypeEngine[Any]:
    """An optional JSON document that may be large (a ready-made HTML body): SQL NULL when
    unset, JSONB on PostgreSQL, LONGTEXT-backed JSON on MariaDB (its JSON is LONGTEXT)."""
    return json_type(none_as_null=True)


def long_text() -> TypeEngine[str]:
    """Text of up to 4 GiB: MariaDB's TEXT stops at 64 KiB (PostgreSQL's and SQLite's have
    no such bound)."""
    return Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def long_binary() -> TypeEngine[Any]:
    """Bytes of up to 4 GiB: MariaDB's BLOB stops at 64 KiB."""
    return LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


def json_type(*, none_as_null: bool = False) -> TypeEngine[Any]:
    """JSON everywhere, JSONB on PostgreSQL (indexable, compact, no duplicate keys).

    `none_as_null`: Python None is SQL NULL rather than JSON `null`, so an unset optional
    column is neither serialized on write nor parsed on read (every claim reads them)."""
    return JSON(none_as_null=none_as_null).with_variant(
        postgresql.JSONB(none_as_null=none_as_null), "postgresql"
    )


def bigint_pk() -> TypeEngine[int]:
    """SQLite only auto-increments an INTEGER PRIMARY KEY."""
    return BigInteger().with_variant(Integer(), "sqlite")


def insert_into(dialect: str, table: Table) -> Any:
    """The dialect's own INSERT, which can say what to do with a taken key."""
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    return mysql.insert(table)


def insert_unless_taken(dialect: str, table: Table, key: Sequence[Column[Any]] = ()) -> Any:
    """An INSERT that skips a row whose unique `key` (any unique key, if none is named) is
    taken, without aborting the transaction. On MariaDB `ON DUPLICATE KEY UPDATE id = id`,
    never INSERT IGNORE: that would also turn truncation and other errors into warnings."""
    insert = insert_into(dialect, table)
    if dialect == "mysql":
        return insert.on_duplicate_key_update(id=table.c.id)
    return insert.on_conflict_do_nothing(index_elements=list(key) or None)


def one_of(dialect: str, column: Column[Any], values: Collection[Any], name: str) -> Any:
    """`column IN values`. On PostgreSQL one array parameter (`= ANY(:name)`): one statement
    text for any number of values, parsed once by psycopg and read by the index (a long IN
    list is new text for each length, and went on being planned as a scan)."""
    if dialect == "postgresql":
        return column == any_(bindparam(name, list(values), type_=ARRAY(column.type)))
    return column.in_(values)
