"""Database URLs, drivers and engines: the one place that knows which driver serves which URL.

Users write plain `sqlite:///path`, `postgresql://...` or `mysql://...` URLs; mailbag picks
its drivers (pysqlite/aiosqlite, psycopg 3 for both sync and async, PyMySQL/asyncmy).

Timeouts, so that a database that stops answering is an error within seconds, not a hang:
- every engine: a connect timeout, and on PostgreSQL TCP keepalives and `tcp_user_timeout`
  (a peer that stops acknowledging is dropped). None of these limit a long statement on a
  healthy connection, so migrations and `purge` keep them too;
- engines given `statement_timeout` (the API's and the worker's): the server ends any
  statement, or PostgreSQL transaction left idle, after that long, and MariaDB's reads
  stop waiting a moment later;
- `within()`: the caller's own bound, which holds even when the network silently swallows
  everything (nothing above can tell that from a slow answer). SQLite has none of this;
  it waits SQLITE_BUSY_TIMEOUT_MS for a lock.
A URL's own query parameters (`?connect_timeout=30`) win over these defaults.

PostgreSQL engines also work behind PgBouncer in transaction pooling mode (docs/pgbouncer.md),
where consecutive transactions may run on different server connections, shared with other
clients, and no startup `options` are accepted:
- the time zone is set to UTC once per connection with `SET TIME ZONE`: TimeZone is one of
  the parameters PgBouncer tracks per client and restores on whichever server it lends;
- the statement and idle-in-transaction bounds are set per transaction (`set_config(...,
  true)`, i.e. SET LOCAL), so they end with it and never reach another client: one short
  statement at each transaction's start;
- psycopg's automatic prepared statements are off: a statement prepared on one server
  connection is unknown on the next (PgBouncer 1.18 does not track them; 1.21 can). A
  direct connection may turn them back on with `?prepare_threshold=5` in its URL.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, Unpack

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

from mailbag.database_url import Dialect as Dialect
from mailbag.database_url import dialect_of as dialect_of
from mailbag.database_url import parse as _parse

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

SQLITE_BUSY_TIMEOUT_MS = 30_000
# Execution option for connections that only read: on SQLite they skip the write lock.
READ_ONLY_OPTION = "mailbag_read_only"
READ_ONLY = {READ_ONLY_OPTION: True}
# Seconds a connect, or a silent network, may take before it is an error (DATABASE_TIMEOUT).
DEFAULT_TIMEOUT = 5.0

T = TypeVar("T")


def sync_url(url: str | URL) -> URL:
    parsed, _, sync_driver, _ = _parse(url)
    return parsed.set(drivername=sync_driver)


def async_url(url: str | URL) -> URL:
    parsed, _, _, async_driver = _parse(url)
    return parsed.set(drivername=async_driver)


class DatabaseTimeout(TimeoutError):
    """The database did not answer within the caller's bound (see `within`)."""


def libpq_options(timeout: float) -> dict[str, Any]:
    """psycopg's connection parameters for this connect and network timeout."""
    seconds = max(2, round(timeout))  # libpq counts whole seconds, 2 at least
    return {
        "connect_timeout": seconds,
        # A peer gone silent (a partition, a dead host): probe an idle connection after
        # a second of quiet, and drop any connection whose sent data stays unacknowledged.
        "keepalives": 1,
        "keepalives_idle": 1,
        "keepalives_interval": 1,
        "keepalives_count": seconds,
        "tcp_user_timeout": seconds * 1000,
        # Never prepare: behind a transaction pooler the next statement may reach a server
        # connection where that name is unknown, or already taken by another client. A
        # URL's `?prepare_threshold=5` turns psycopg's preparing back on (direct connections,
        # PgBouncer >= 1.21 with max_prepared_statements): see _prepare_threshold.
        "prepare_threshold": None,
    }


# The server settings a PostgreSQL engine makes itself, unless the URL's own `options`
# set them (`?options=-c statement_timeout=0`: the URL wins, on a direct connection).
_TIME_ZONE = "timezone"
_STATEMENT_BOUNDS = ("statement_timeout", "idle_in_transaction_session_timeout")
_OPTION_NAME = re.compile(r"(?:-c\s*|--)([A-Za-z_.]+)\s*=")


def _set_by_url(url: URL) -> set[str]:
    """The server settings the URL's own `options` startup parameter sets."""
    own = url.query.get("options")
    text = " ".join(own) if isinstance(own, tuple) else own or ""
    return {name.lower().replace("-", "_") for name in _OPTION_NAME.findall(text)}


def _configure_postgresql(engine: Engine, url: URL, statement_timeout: float | None) -> None:
    """UTC per connection, the statement bounds per transaction (see the module docstring)."""
    own = _set_by_url(url)
    if _TIME_ZONE not in own:

        @event.listens_for(engine, "connect")
        def _utc(dbapi_connection: Any, _record: Any) -> None:
            # Timestamps then come back tagged with Python's own UTC: no conversion. In
            # autocommit: a session setting, outside any transaction SQLAlchemy manages.
            autocommit = dbapi_connection.autocommit
            dbapi_connection.autocommit = True
            try:
                cursor = dbapi_connection.cursor()
                cursor.execute("SET TIME ZONE 'UTC'")
                cursor.close()
            finally:
                dbapi_connection.autocommit = autocommit

    bounds = [name for name in _STATEMENT_BOUNDS if name not in own]
    if statement_timeout is None or not bounds:
        return
    ms = max(1, round(statement_timeout * 1000))
    # One statement, one round trip: is_local=true makes each a SET LOCAL, gone at the
    # transaction's end, so a pooled server connection never carries it to another client.
    bound = "SELECT " + ", ".join(f"set_config('{name}', '{ms}', true)" for name in bounds)

    @event.listens_for(engine, "begin")
    def _bounded(connection: Any) -> None:
        connection.exec_driver_sql(bound)

    # A pipelined transaction (store/pipeline.py) begins outside SQLAlchemy: it sends the
    # same statement after its BEGIN, in the same round trip.
    @event.listens_for(engine, "connect")
    def _bounds_known(_dbapi_connection: Any, record: Any) -> None:
        record.info[TRANSACTION_BOUNDS] = bound


# The pool record's key for the statement a PostgreSQL transaction starts with (its bounds).
TRANSACTION_BOUNDS = "mailbag_transaction_bounds"


STRICT_SQL_MODE = (
    "SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'STRICT_ALL_TABLES')"
)


def _mysql_options(
    timeout: float, statement_timeout: float | None, *, asynchronous: bool
) -> dict[str, Any]:
    options: dict[str, Any] = {"connect_timeout": max(1, round(timeout))}
    if not asynchronous:
        options["write_timeout"] = max(1, round(timeout))  # PyMySQL only
    # Strict, whatever the server's default: a lenient sql_mode (sql_mode='' is still some
    # servers' setting) stores a value too long for its column cut short with a warning,
    # so a message accepted would not be the message sent. Strict, it is an error (422).
    init = [STRICT_SQL_MODE]
    if statement_timeout is not None:
        # The server ends the statement first (a clean error); a read that still waits a
        # moment later means the server or the network is gone. MariaDB only (`/*M!`):
        # MySQL reads the variable as a comment.
        options["read_timeout"] = max(1, round(statement_timeout + 1))
        init.append(f"@mailbag = 1 /*M! , SESSION max_statement_time = {statement_timeout:g} */")
    options["init_command"] = "SET " + ", ".join(init)
    return options


def json_loads(data: str | bytes) -> Any:
    """json.loads, faster: the empty object and array (most rows' headers, tags and
    metadata: several per claimed message) are made without parsing, and the rest is
    parsed by orjson (~20x faster for a template's data) unless it could hold an integer
    beyond 64 bits, which orjson would turn into a float (json.loads keeps it exact), or
    anything else orjson refuses (a lone surrogate): those go to json.loads."""
    if data == b"{}" or data == "{}":
        return {}
    if data == b"[]" or data == "[]":
        return []
    long_number = _LONG_DIGITS_BYTES if isinstance(data, bytes) else _LONG_DIGITS
    if long_number.search(data) is None:  # type: ignore[arg-type]
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


# 19 digits in a row: maybe an integer orjson cannot keep exact (2**63 has 19 digits).
_LONG_DIGITS = re.compile("[0-9]{19}")
_LONG_DIGITS_BYTES = re.compile(b"[0-9]{19}")


def _engine_options(
    url: URL,
    asynchronous: bool,
    *,
    pool_size: int | None = None,
    null_pool: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    statement_timeout: float | None = None,
    pre_ping: bool = True,
    execution_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    dialect = dialect_of(url)
    # hide_parameters: a database error's message would carry the statement's values (a
    # recipient, an Idempotency-Key, template data) into every log that prints it.
    options: dict[str, Any] = {
        "pool_pre_ping": pre_ping and dialect != "sqlite",
        "hide_parameters": True,
    }
    if execution_options:
        options["execution_options"] = dict(execution_options)
    if null_pool:
        options["poolclass"] = NullPool
    elif pool_size is not None and dialect != "sqlite":
        # No overflow: connections beyond the pool would be opened and closed per use (a
        # server process forked each time); callers wait for a pooled one instead, but
        # not for ever.
        options.update(pool_size=pool_size, max_overflow=0, pool_timeout=timeout)
    if dialect == "postgresql":
        options["json_deserializer"] = json_loads
    if dialect == "mysql":
        # Fresh reads in every statement and no gap locks: the claim and finalize rely on
        # row locks only, and a duplicate enqueue must see the row that beat it.
        options["isolation_level"] = "READ COMMITTED"
    args = connect_args(url, timeout, statement_timeout, asynchronous=asynchronous)
    if args:
        options["connect_args"] = args
    return options


def connect_args(
    url: str | URL,
    timeout: float,
    statement_timeout: float | None = None,
    *,
    asynchronous: bool = True,
) -> dict[str, Any]:
    """The driver's connection parameters for these timeouts, less any the URL sets itself."""
    parsed = make_url(url) if isinstance(url, str) else url
    args: dict[str, Any] = {}
    dialect = dialect_of(parsed)
    if dialect == "postgresql":
        # The statement bounds are not connection parameters here: see _configure_postgresql.
        args = libpq_options(timeout)
        own_options = parsed.query.get("options")
        if isinstance(own_options, str):
            args["options"] = own_options  # the URL's own `-c` settings, passed on as they are
        if "prepare_threshold" in parsed.query:
            args["prepare_threshold"] = _prepare_threshold(parsed.query["prepare_threshold"])
    if dialect == "mysql":
        args = _mysql_options(timeout, statement_timeout, asynchronous=asynchronous)
    typed = ("options", "prepare_threshold")  # the URL's text, made what psycopg takes
    return {k: v for k, v in args.items() if k in typed or k not in parsed.query}


def _prepare_threshold(value: str | tuple[str, ...]) -> int | None:
    """A URL's `prepare_threshold` as psycopg takes it: a count, or None (`none`: never)."""
    text = value[-1] if isinstance(value, tuple) else value
    if text.strip().lower() in ("", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"prepare_threshold in the database URL must be a number or none, not {text!r}"
        ) from None


class EngineOptions(TypedDict, total=False):
    pool_size: int | None  # None: SQLAlchemy's default pool
    null_pool: bool  # no pool: a connection per use (commands that run once)
    timeout: float  # connecting and a silent network (DEFAULT_TIMEOUT)
    statement_timeout: float | None  # each statement; None: no bound (migrations, operators)
    # A round trip per checkout to find a dead connection first (True); False for callers
    # that take any database error as "wait and retry" anyway (the worker).
    pre_ping: bool
    # What every connection carries for the plans it runs (store/plan.py connection_option):
    # how this process fans events out to hook endpoints (store/hooks.py FanOut).
    execution_options: Mapping[str, Any]


def make_engine(url: str | URL, **options: Unpack[EngineOptions]) -> Engine:
    """A sync engine with these timeouts and pool (see the module's docstring)."""
    engine_url = sync_url(url)
    engine = create_engine(engine_url, **_engine_options(engine_url, False, **options))
    _configure(engine, engine_url, options.get("statement_timeout"))
    return engine


def make_async_engine(url: str | URL, **options: Unpack[EngineOptions]) -> AsyncEngine:
    """The async twin of `make_engine`, with the same options."""
    # Imported here: it brings in the ORM, which sync commands (enqueue, purge) never need.
    from sqlalchemy.ext.asyncio import create_async_engine

    engine_url = async_url(url)
    engine = create_async_engine(engine_url, **_engine_options(engine_url, True, **options))
    _configure(engine.sync_engine, engine_url, options.get("statement_timeout"))
    return engine


def _configure(engine: Engine, url: URL, statement_timeout: float | None) -> None:
    dialect = dialect_of(url)
    if dialect == "sqlite":
        _configure_sqlite(engine)
    elif dialect == "postgresql":
        _configure_postgresql(engine, url, statement_timeout)


# Work given up by `within`, kept referenced until its cancellation has finished.
_abandoned: set[asyncio.Future[Any]] = set()


def abandon(work: asyncio.Future[Any]) -> None:
    """Cancel `work` without waiting for it to wind down.

    A cancelled psycopg query first asks the server to cancel it and waits for that (up to
    ten seconds); across a partition no answer comes, so its caller must not wait. The
    connection it held is thrown away when it is done (SQLAlchemy invalidates a connection
    interrupted by a cancellation), so nothing half-finished is reused.
    """
    work.cancel()
    _abandoned.add(work)
    work.add_done_callback(_forget)


def _forget(work: asyncio.Future[Any]) -> None:
    _abandoned.discard(work)
    if not work.cancelled():
        work.exception()  # retrieved: the caller already reported the timeout


async def within(seconds: float | None, work: Awaitable[T]) -> T:
    """Await database work for at most `seconds` (None: no bound), else DatabaseTimeout.

    The answer comes on time even when the network swallows everything: the work is
    abandoned (cancelled, not waited for). Work that may have committed when it was given
    up is the caller's ambiguity, exactly as with a connection lost during a COMMIT.
    """
    if seconds is None:
        return await work
    task = asyncio.ensure_future(work)
    try:
        done = await wait_done(task, seconds)
    except asyncio.CancelledError:
        abandon(task)
        raise
    if not done:
        abandon(task)
        raise DatabaseTimeout(f"the database did not answer within {seconds:g} s")
    return task.result()


async def wait_done(work: asyncio.Future[Any], seconds: float) -> bool:
    """Wait until `work` is done or `seconds` have passed, without touching it: is it done?
    (asyncio.wait does the same at twice the cost, and this runs on every database round.)"""
    if work.done():
        return True
    waiter = asyncio.get_running_loop().create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    work.add_done_callback(wake)
    timer = asyncio.get_running_loop().call_later(seconds, wake)
    try:
        await waiter
    finally:
        timer.cancel()
        work.remove_done_callback(wake)
    return work.done()


def _switch_to_wal(cursor: Any) -> None:
    """`PRAGMA journal_mode = WAL`, waiting for a lock the way busy_timeout would.

    Switching a new file to WAL takes an exclusive lock and SQLite does not apply
    busy_timeout to it: processes opening a fresh database at the same moment (`serve` and
    a worker, parallel migrations) would see "database is locked" at once. The mode stays
    with the file, so this waits only on a database's first opening.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


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
        _switch_to_wal(cursor)
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # Readers (marked with READ_ONLY) need no write lock: WAL lets them run beside a writer.
        read_only = connection.get_execution_options().get(READ_ONLY_OPTION, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")
