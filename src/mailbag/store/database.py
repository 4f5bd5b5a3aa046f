"""Database URLs, drivers and engines: the one place that knows which driver serves which URL.

Users write plain `sqlite:///path`, `postgresql://...` or `mysql://...` URLs; mailbag picks
its drivers (pysqlite/aiosqlite, psycopg 3 for both sync and async, PyMySQL/asyncmy).
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

Dialect = Literal["sqlite", "postgresql", "mysql"]

_DRIVERS: dict[str, tuple[Dialect, str, str]] = {
    # scheme: (dialect, sync driver, async driver)
    "sqlite": ("sqlite", "sqlite", "sqlite+aiosqlite"),
    "postgresql": ("postgresql", "postgresql+psycopg", "postgresql+psycopg_async"),
    "postgres": ("postgresql", "postgresql+psycopg", "postgresql+psycopg_async"),
    "mysql": ("mysql", "mysql+pymysql", "mysql+asyncmy"),
    "mariadb": ("mysql", "mysql+pymysql", "mysql+asyncmy"),
}
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Execution option for connections that only read: on SQLite they skip the write lock.
READ_ONLY_OPTION = "mailbag_read_only"
READ_ONLY = {READ_ONLY_OPTION: True}


class UnsupportedDatabase(ValueError):
    pass


def _parse(url: str | URL) -> tuple[URL, Dialect, str, str]:
    parsed = make_url(url) if isinstance(url, str) else url
    scheme = parsed.drivername.split("+", 1)[0]
    if scheme not in _DRIVERS:
        raise UnsupportedDatabase(
            f"unsupported database URL scheme {scheme!r}: use sqlite:///, postgresql:// or mysql://"
        )
    dialect, sync_driver, async_driver = _DRIVERS[scheme]
    if dialect == "mysql" and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return parsed, dialect, sync_driver, async_driver


def dialect_of(url: str | URL) -> Dialect:
    return _parse(url)[1]


def sync_url(url: str | URL) -> URL:
    parsed, _, sync_driver, _ = _parse(url)
    return parsed.set(drivername=sync_driver)


def async_url(url: str | URL) -> URL:
    parsed, _, _, async_driver = _parse(url)
    return parsed.set(drivername=async_driver)


def _engine_options(dialect: Dialect, pool_size: int | None, null_pool: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"pool_pre_ping": dialect != "sqlite"}
    if null_pool:
        options["poolclass"] = NullPool
    elif pool_size is not None and dialect != "sqlite":
        # No overflow: connections beyond the pool would be opened and closed per use (a
        # server process forked each time); callers wait for a pooled one instead.
        options.update(pool_size=pool_size, max_overflow=0)
    if dialect == "postgresql":
        # Timestamps come back tagged with Python's own UTC, which needs no conversion.
        options["connect_args"] = {"options": "-c timezone=UTC"}
    if dialect == "mysql":
        # Fresh reads in every statement and no gap locks: the claim and finalize rely on
        # row locks only, and a duplicate enqueue must see the row that beat it.
        options["isolation_level"] = "READ COMMITTED"
    return options


def make_engine(url: str | URL, *, pool_size: int | None = None, null_pool: bool = False) -> Engine:
    dialect = dialect_of(url)
    engine = create_engine(sync_url(url), **_engine_options(dialect, pool_size, null_pool))
    if dialect == "sqlite":
        _configure_sqlite(engine)
    return engine


def make_async_engine(
    url: str | URL, *, pool_size: int | None = None, null_pool: bool = False
) -> AsyncEngine:
    dialect = dialect_of(url)
    engine = create_async_engine(async_url(url), **_engine_options(dialect, pool_size, null_pool))
    if dialect == "sqlite":
        _configure_sqlite(engine.sync_engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    """WAL for concurrent readers, a busy timeout for concurrent writers, and BEGIN IMMEDIATE.

    A deferred transaction that reads and then writes can fail at once with SQLITE_BUSY when
    another connection wrote in between; taking the write lock up front makes each claim or
    finalize wait its turn instead.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let SQLAlchemy's BEGIN below take over
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # Readers (marked with READ_ONLY) need no write lock: WAL lets them run beside a writer.
        read_only = connection.get_execution_options().get(READ_ONLY_OPTION, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")
