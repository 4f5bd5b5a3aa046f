"""Leadership locks: at most one holder across the fleet, and the lock dies with its holder.

Each lock is a session's (or an open file's), so the server (or the kernel) frees it when
the holder's process dies, however it dies; nothing has to expire by the clock.
- `SessionLock`, PostgreSQL: `pg_try_advisory_lock` on a connection of its own. Behind a
  transaction pooler each statement may reach another server session, so the connection
  must be direct; a lock session whose backend changes under it raises `LockLost`;
- `SessionLock`, MariaDB/MySQL: `GET_LOCK`. Named locks are server-wide, so the name
  carries the database's;
- `FileLock`, SQLite: an exclusive `flock` on a file beside the database;
- `OnlyProcess`: an in-memory SQLite database (one process by definition): always held.

worker/scheduler.py elects with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from mailbag.store.database import dialect_of, make_async_engine, within

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

# The errors of a session that is gone or does not answer (DatabaseTimeout is an OSError).
SESSION_ERRORS = (SQLAlchemyError, OSError)

# Per dialect: (take the lock if free, is it this session's), each with the session's id.
# PostgreSQL's key is two int4: "mail" (0x6D61696C) and 1, the scheduler; pg_locks shows
# them as classid and objid, with objsubid 2 for a two-key lock.
LOCK_SQL = {
    "postgresql": (
        "SELECT pg_try_advisory_lock(1835100524, 1), pg_backend_pid()",
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND classid = 1835100524 AND objid = 1 AND objsubid = 2"
        " AND pid = pg_backend_pid()), pg_backend_pid()",
    ),
    "mysql": (
        "SELECT GET_LOCK(:name, 0) = 1, CONNECTION_ID()",
        "SELECT COALESCE(IS_USED_LOCK(:name) = CONNECTION_ID(), 0), CONNECTION_ID()",
    ),
}
MYSQL_NAME_MAX = 64  # MariaDB and MySQL refuse longer lock names


class Lock(Protocol):
    """A lock that at most one replica holds, and that dies with its holder."""

    kind: str  # what it is, for the logs

    async def acquire(self) -> bool:
        """Take the lock if it is free: True if this replica holds it now."""
        ...

    async def held(self) -> bool:
        """Whether the lock is still this replica's (False once its session is gone)."""
        ...

    async def release(self) -> None:
        """Give the lock up (and the connection it lives on)."""
        ...


class LockLost(Exception):
    """The lock session no longer holds the lock, or is not one session (why: the text)."""


class SessionLock:
    """A lock held by a database session of its own: PostgreSQL's advisory lock, MariaDB's
    GET_LOCK. Its connection is autocommit (no transaction is ever left open on it) and
    each round trip is bounded by `timeout`; any error drops the connection, and with it
    the lock. Each `acquire` of a follower connects, asks, and disconnects."""

    def __init__(self, url: str, *, lease: float, timeout: float) -> None:
        self.dialect = dialect_of(url)
        self.kind = "postgresql advisory lock" if self.dialect == "postgresql" else "mysql GET_LOCK"
        self.lease, self.timeout = lease, timeout
        self.engine: AsyncEngine = make_async_engine(
            url, null_pool=True, timeout=timeout, statement_timeout=None
        )
        self.connection: AsyncConnection | None = None
        self.name = ""  # MariaDB's lock name (it carries the database's)
        self.session: Any = None  # the server session that took the lock

    async def acquire(self) -> bool:
        try:
            if self.connection is None:
                self.connection = await within(self.timeout, self._connect())
            got, session = await self._ask(LOCK_SQL[self.dialect][0])
        except BaseException:
            await self.release()
            raise
        if not got:
            # A follower keeps no connection between tries: behind a pooler, direct
            # connections are the scarce ones (the leader's one, and LISTEN's).
            await self.release()
            return False
        self.session = session
        return True

    async def held(self) -> bool:
        if self.connection is None or self.session is None:
            return False  # never taken since the last connect
        try:
            held, session = await self._ask(LOCK_SQL[self.dialect][1])
            if session != self.session:
                raise LockLost(
                    "the lock's connection changed sessions under it: a transaction pooler "
                    "between them? LISTEN_URL must reach the database directly"
                )
        except BaseException:
            await self.release()
            raise
        if not held:
            await self.release()
        return bool(held)

    async def release(self) -> None:
        connection, self.connection, self.session = self.connection, None, None
        if connection is not None:
            # Closing the session frees the lock; a dead one has nothing left to free.
            with contextlib.suppress(*SESSION_ERRORS):
                await within(self.timeout, connection.close())

    async def dispose(self) -> None:
        await self.release()
        await self.engine.dispose()

    async def _connect(self) -> AsyncConnection:
        connection = await self.engine.connect()
        connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
        try:
            if self.dialect == "postgresql":
                # A holder whose host vanished loses the lock once the server gives up on
                # its silent connection: a third of a lease between probes, three probes.
                probe = str(max(1, round(self.lease / 3)))
                await connection.execute(
                    text(
                        "SELECT set_config('tcp_keepalives_idle', :probe, false),"
                        " set_config('tcp_keepalives_interval', :probe, false),"
                        " set_config('tcp_keepalives_count', '3', false)"
                    ),
                    {"probe": probe},
                )
            else:
                # The holder confirms every third of a lease: a session silent for two
                # leases has lost its holder, and the server ends it (freeing the lock).
                wait = max(2, math.ceil(self.lease * 2))
                await connection.execute(text(f"SET SESSION wait_timeout = {wait}"))
                database = (await connection.execute(text("SELECT DATABASE()"))).scalar_one()
                self.name = mysql_lock_name(str(database or ""))
        except BaseException:
            with contextlib.suppress(*SESSION_ERRORS):
                await connection.close()
            raise
        return connection

    async def _ask(self, sql: str) -> tuple[Any, Any]:
        assert self.connection is not None
        params = {"name": self.name} if self.dialect == "mysql" else {}
        result = await within(self.timeout, self.connection.execute(text(sql), params))
        row = result.one()
        return row[0], row[1]


def mysql_lock_name(database: str) -> str:
    """The scheduler lock's name in this database: server-wide names must tell databases
    apart, within MariaDB's 64 characters (a long database name is shortened by a hash)."""
    name = f"mailbag.scheduler.{database}"
    if len(name) <= MYSQL_NAME_MAX:
        return name
    return f"mailbag.scheduler.{hashlib.sha256(database.encode()).hexdigest()[:40]}"


class FileLock:
    """SQLite: an exclusive flock on a file beside the database. The kernel frees it when
    the process exits, however it exits."""

    def __init__(self, path: Path) -> None:
        self.path, self.kind = path, f"file lock {path}"
        self.fd: int | None = None

    async def acquire(self) -> bool:
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    async def held(self) -> bool:
        return self.fd is not None

    async def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)  # closing the file frees its flock


class OnlyProcess:
    """An in-memory SQLite database, or a system without flock: one process, the leader."""

    kind = "single process"

    async def acquire(self) -> bool:
        return True

    async def held(self) -> bool:
        return True

    async def release(self) -> None:
        return None
