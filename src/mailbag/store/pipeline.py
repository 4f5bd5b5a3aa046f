"""Batches of statements sent to PostgreSQL at once: psycopg's pipeline mode, for sessions.

A plan yields the statements that need none of each other's answers together
(store.plan.together). AsyncDatabase.run_at_once holds a transaction for one plan, and on
psycopg hands each such batch here: it goes to the server in one round trip, with the
BEGIN before it and, when it is the plan's last, the COMMIT after it (store.plan.round_trip;
a lone statement that is the whole plan goes alone, in autocommit). The server runs one
statement after the other without waiting for the client in between, so a lock the first
one takes is held for the server's work only, not across round trips and the event loop's
turns of every other request in flight (the verification request, store/first_use.py).

psycopg receives what SQLAlchemy would send it: each statement compiled for the
connection's dialect (once per statement object: build statements once and bind their
values by name), its values through the same type processors (JSON, UTC times), and the
rows come back through their columns' result processors, as a Result (no rowcount: a plan
reads what a batched statement returns). The SQL is handed over with PostgreSQL's own
placeholders ($1) through a raw cursor, so psycopg parses nothing. Parameters SQLAlchemy
expands at execution (`IN` lists) are refused: bind an array instead.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import Executable, Result
from sqlalchemy.engine import Dialect as SQLDialect
from sqlalchemy.engine import IteratorResult
from sqlalchemy.engine.result import SimpleResultMetaData
from sqlalchemy.exc import DBAPIError

from mailbag.store.database import TRANSACTION_BOUNDS
from mailbag.store.plan import Params, Step, Steps, Together, round_trip

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.ext.asyncio import AsyncConnection

T = TypeVar("T")
Processor = Callable[[Any], Any] | None

# SQLAlchemy's psycopg placeholders (`%(name)s`) and its escaped percent sign.
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


def takes(conn: AsyncConnection) -> bool:
    """Whether batches on this connection go through here (psycopg's pipeline mode)."""
    return conn.dialect.driver == "psycopg"


@dataclass
class _Compiled:
    """One statement as psycopg's raw cursor takes it, for one dialect: its parameters in
    the order of $1, $2... by the names a plan gives their values by (`keys`), with a
    literal's own value (`defaults`) and the type's processor."""

    sql: str
    keys: tuple[str, ...]
    defaults: tuple[Any, ...]
    required: frozenset[str]
    processors: tuple[Processor, ...]
    columns: tuple[Any, ...]  # what it returns, for the result processors
    # Learnt from its first answer (the server names the types): its rows' keys, and each
    # column's result processor.
    metadata: SimpleResultMetaData | None = field(default=None)
    results: tuple[Processor, ...] = ()

    def values(self, params: Params) -> list[Any]:
        if params is not None and not isinstance(params, Mapping):
            raise ValueError("a statement sent at once takes one set of parameters")
        given = params or {}
        if not self.required <= given.keys():
            raise KeyError(f"no value for {', '.join(sorted(self.required - given.keys()))}")
        raw = [given.get(k, d) for k, d in zip(self.keys, self.defaults, strict=True)]
        return [v if p is None else p(v) for p, v in zip(self.processors, raw, strict=True)]

    async def result(self, cursor: psycopg.AsyncRawCursor[Any], dialect: SQLDialect) -> Result[Any]:
        """The Result of this statement's answer in `cursor`."""
        from psycopg.pq import ExecStatus

        answer = cursor.pgresult
        if answer is None or answer.status != ExecStatus.TUPLES_OK:
            return IteratorResult(_NO_COLUMNS, iter(()))
        if self.metadata is None:
            description = cursor.description or []
            self.results = tuple(
                column.type.dialect_impl(dialect).result_processor(dialect, d.type_code)
                for column, d in zip(self.columns, description, strict=False)
            )
            self.metadata = SimpleResultMetaData([d.name for d in description])
        rows = await cursor.fetchall()
        if any(self.results):
            rows = [
                tuple(v if p is None else p(v) for p, v in zip(self.results, row, strict=False))
                for row in rows
            ]
        return IteratorResult(self.metadata, iter(rows))


_NO_COLUMNS = SimpleResultMetaData([])


_COMPILED: weakref.WeakKeyDictionary[Executable, weakref.WeakKeyDictionary[SQLDialect, _Compiled]]
_COMPILED = weakref.WeakKeyDictionary()


def compiled(statement: Executable, dialect: SQLDialect) -> _Compiled:
    """`statement` compiled for `dialect` as a raw cursor takes it (once per statement)."""
    per_dialect = _COMPILED.get(statement)
    if per_dialect is None:
        per_dialect = _COMPILED[statement] = weakref.WeakKeyDictionary()
    found = per_dialect.get(dialect)
    if found is None:
        found = per_dialect[dialect] = _compile(statement, dialect)
    return found


def _compile(statement: Executable, dialect: SQLDialect) -> _Compiled:
    sql_compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
    numbers: dict[str, int] = {}

    def placeholder(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return "%"
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    sql = _PLACEHOLDER.sub(placeholder, str(sql_compiled))
    binds = [sql_compiled.binds[name] for name in numbers]
    for bind in binds:
        if bind.expanding or bind.literal_execute:
            raise ValueError(
                f"{bind.key}: a parameter expanded at execution cannot be sent at once"
            )
    return _Compiled(
        sql,
        keys=tuple(bind.key for bind in binds),
        defaults=tuple(bind.effective_value for bind in binds),
        required=frozenset(bind.key for bind in binds if bind.required),
        processors=tuple(bind.type.dialect_impl(dialect).bind_processor(dialect) for bind in binds),
        columns=tuple(getattr(statement, "exported_columns", ())),
    )


async def run(conn: AsyncConnection, steps: Steps[T], first: Together) -> T:
    """Answer a plan's steps on `conn`, a connection in autocommit held for this plan alone:
    `first` (a batch the caller took already) and every later instruction go as their own
    round trip each, BEGIN and COMMIT where store.plan.round_trip says. An error rolls the
    transaction back (SQLAlchemy's exception for it is raised); a connection left in a
    state nobody knows (cancelled mid-round-trip) is never used again."""
    raw = await conn.get_raw_connection()
    pg = cast("psycopg.AsyncConnection[Any]", raw.driver_connection)
    assert pg.autocommit, "the transaction is this runner's own"
    bounds: str | None = raw.info.get(TRANSACTION_BOUNDS)  # the engine's statement bounds
    opened = ended = False
    instruction: Step | Together = first
    try:
        while True:
            if ended:
                raise RuntimeError("a plan yielded SQL after the batch it called its last")
            batch = instruction if isinstance(instruction, Together) else Together((instruction,))
            begin, commit = round_trip(batch, in_transaction=opened)
            answers = await _send(
                pg, conn.dialect, batch.steps, begin=begin, commit=commit, bounds=bounds
            )
            opened, ended = (opened or begin) and not commit, batch.last
            if isinstance(instruction, Together):
                instruction = steps.send(cast(Result[Any], answers))  # see store.plan.Plan
            else:
                instruction = steps.send(answers[0])
    except StopIteration as done:
        if opened:
            await _send(pg, conn.dialect, (), begin=False, commit=True)
        return done.value  # type: ignore[no-any-return]
    except BaseException as exc:
        await _abandon(conn, pg, cancelled=not isinstance(exc, Exception))
        raise


async def _send(
    pg: psycopg.AsyncConnection[Any],
    dialect: SQLDialect,
    steps: Sequence[Step],
    *,
    begin: bool,
    commit: bool,
    bounds: str | None = None,
) -> tuple[Result[Any], ...]:
    """One round trip: BEGIN (if asked) and the transaction's `bounds` (its statement and
    idle timeouts, as every other transaction of the engine starts), the steps, COMMIT (if
    asked); their Results."""
    import psycopg  # here: only PostgreSQL comes here, and other installs may lack psycopg

    statements = [compiled(step.statement, dialect) for step in steps]
    values = [c.values(step.params) for c, step in zip(statements, steps, strict=True)]
    cursors = [psycopg.AsyncRawCursor(pg) for _ in steps]
    try:
        if len(steps) == 1 and not begin and not commit:
            await cursors[0].execute(statements[0].sql, values[0])
        else:
            async with pg.pipeline():
                if begin:
                    await pg.execute("BEGIN")
                    if bounds is not None:
                        await pg.execute(bounds)
                for cursor, statement, given in zip(cursors, statements, values, strict=True):
                    await cursor.execute(statement.sql, given)
                if commit:
                    await pg.execute("COMMIT")
        return tuple(
            [await s.result(cursor, dialect) for s, cursor in zip(statements, cursors, strict=True)]
        )
    except psycopg.Error as exc:
        sql = "; ".join(s.sql for s in statements) or "COMMIT"
        # As SQLAlchemy raises it: IntegrityError for a unique index, OperationalError for
        # a database gone away...
        raise DBAPIError.instance(
            sql, None, exc, psycopg.Error, connection_invalidated=pg.closed, dialect=dialect
        ) from exc
    finally:
        for cursor in cursors:
            await cursor.close()


async def _abandon(
    conn: AsyncConnection, pg: psycopg.AsyncConnection[Any], *, cancelled: bool
) -> None:
    """End a failed transaction; a connection that cannot say where it stands is dropped."""
    import psycopg
    from psycopg.pq import TransactionStatus

    if not cancelled and not pg.closed:
        try:
            if pg.info.transaction_status != TransactionStatus.IDLE:
                await pg.execute("ROLLBACK")
            return
        except psycopg.Error:
            pass
    await conn.invalidate()
