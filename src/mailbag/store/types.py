"""Column types that behave the same on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Dialect, Integer
from sqlalchemy.dialects import mysql, postgresql
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

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None or value.tzinfo is UTC:
            return value
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def json_type() -> TypeEngine[Any]:
    """JSON everywhere, JSONB on PostgreSQL (indexable, compact, no duplicate keys)."""
    return JSON().with_variant(postgresql.JSONB(), "postgresql")


def bigint_pk() -> TypeEngine[int]:
    """SQLite only auto-increments an INTEGER PRIMARY KEY."""
    return BigInteger().with_variant(Integer(), "sqlite")
