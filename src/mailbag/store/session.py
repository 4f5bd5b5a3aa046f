"""Sessions: what services hold instead of engines, connections and dialects.

A session is one connection (one transaction, or the caller's own connection when an
application enqueues inside its transaction) that knows its dialect and runs plans on it:

    async with AsyncDatabase(engine).transaction() as tx:
        claim = await tx.run(dispatch.claim(worker_id=..., now=..., lease=..., limit=...))

Rules:
- a session never commits by itself: `transaction()` commits when its block ends without
  an error (and rolls back otherwise), `connect()` reads and rolls back, and a session
  made from a caller's connection leaves the transaction to the caller;
- sync and async differ by the `await` only: both run plans through store.plan, which
  answers every plan's dialect question from the connection;
- a write a constraint refuses (in mailbag: a unique index, because another transaction
  got there first) raises `Conflict`, SQLAlchemy's IntegrityError translated here once;
- pipelining is the session's, not a service's: `AsyncDatabase.run_at_once(plan)` runs one
  plan in a transaction of its own and sends what the plan yields together
  (store.plan.together) in one round trip, BEGIN and COMMIT included, on psycopg
  (store/pipeline.py); elsewhere it is an ordinary transaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Generic, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError

from mailbag.database_url import Dialect, dialect_of
from mailbag.store import pipeline
from mailbag.store.database import READ_ONLY
from mailbag.store.plan import (
    Plan,
    Together,
    answering,
    dialect_of_connection,
    options_of,
    resume_async,
    run,
    run_async,
)

if TYPE_CHECKING:  # the asyncio extension brings in the ORM: only async callers load it
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

T = TypeVar("T")
C = TypeVar("C", "Connection", "AsyncConnection")
E = TypeVar("E", "Engine", "AsyncEngine")


class Conflict(Exception):
    """A constraint refused a write: a unique index says another row holds the key. The
    transaction cannot go on; what it wrote is rolled back when its block ends."""


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except IntegrityError as exc:
        raise Conflict(str(exc)) from exc


class _Bound(Generic[C]):
    def __init__(self, connection: C) -> None:
        self.connection: C = connection
        self.dialect: Dialect = dialect_of_connection(connection)


class Session(_Bound[Connection]):
    """Plans run on one sync connection."""

    def run(self, plan: Plan[T]) -> T:
        with _translated():
            return run(self.connection, plan)


class AsyncSession(_Bound["AsyncConnection"]):
    """Plans run on one async connection."""

    async def run(self, plan: Plan[T]) -> T:
        with _translated():
            return await run_async(self.connection, plan)


class _Engine(Generic[E]):
    def __init__(self, engine: E) -> None:
        self.engine: E = engine
        self.dialect: Dialect = dialect_of(engine.url)


class Database(_Engine[Engine]):
    """Sessions on a sync engine's connections."""

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        with self.engine.begin() as conn:
            yield Session(conn)

    @contextmanager
    def connect(self, *, read_only: bool = False) -> Iterator[Session]:
        """A session for reads; `read_only` spares SQLite's write lock."""
        with self.engine.connect() as conn:
            yield Session(conn.execution_options(**READ_ONLY) if read_only else conn)


AUTOCOMMIT = {"isolation_level": "AUTOCOMMIT"}


class AsyncDatabase(_Engine["AsyncEngine"]):
    """Sessions on an async engine's connections."""

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        async with self.engine.begin() as conn:
            yield AsyncSession(conn)

    @asynccontextmanager
    async def connect(
        self, *, read_only: bool = False, autocommit: bool = False
    ) -> AsyncIterator[AsyncSession]:
        """A session for reads; `read_only` spares SQLite's write lock. `autocommit`: each
        statement on its own snapshot, without the BEGIN and ROLLBACK round trips around
        them (for reads that need no snapshot in common: one statement, or rows that never
        change once written)."""
        async with self.engine.connect() as conn:
            options = {**(READ_ONLY if read_only else {}), **(AUTOCOMMIT if autocommit else {})}
            if options:
                conn = await conn.execution_options(**options)
            yield AsyncSession(conn)

    async def run_at_once(self, plan: Plan[T]) -> T:
        """Run `plan` in a transaction of its own, committed when it returns, sending at once
        what it yields together (store.plan.together). On psycopg, a plan whose first SQL is
        such a batch has every batch go in one round trip, the first with BEGIN before it
        and its `last` with COMMIT after it (pipeline mode, store/pipeline.py), and a lone
        statement that is the whole plan go alone, atomic by itself. Any other plan, and
        every other driver: as in `transaction()`, the batch's steps one after the other."""
        async with self.engine.connect() as conn:
            steps = answering(plan, dialect_of_connection(conn), options_of(conn))
            with _translated():
                try:
                    first = next(steps)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]  # no SQL at all
                if isinstance(first, Together) and pipeline.takes(conn):
                    conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                    return await pipeline.run(conn, steps, first)
                async with conn.begin():
                    return await resume_async(conn, steps, first)
