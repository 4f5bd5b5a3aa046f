"""Store operations are written once, as plans, and run on a sync or an async connection.

A plan is a generator that yields SQL steps and receives each step's result; it returns the
operation's answer. The plan never touches a connection, so the same SQL serves the CLI's
sync `Connection`, the worker's and API's `AsyncConnection`, a caller's own transaction, and
the recorder that writes docs/sql (mailbag/sqlrecorder.py).

A plan whose SQL differs between databases asks its runner which one it runs on
(`dialect = yield from current_dialect()`): the runner answers from its connection, so no
caller ever passes a dialect along. A plan that depends on how its process is configured
asks for an option the session's builder set on the engine or connection (SQLAlchemy's
execution options; `yield from connection_option(NAME)`, None when unset): the hooks'
fan-out is one (store/hooks.py), so that no module holds a process-wide switch. Every
runner drives a plan through `answering`, which answers those questions and hands the
runner the SQL steps only; `run` and `run_async` differ by the `await` and nothing else.

Statements that need none of each other's answers may be yielded together
(`a, b = yield from together(Step(...), Step(...))`): a runner that can pipeline sends them
to the server at once, in one round trip (AsyncDatabase.run_at_once on psycopg), and every
other runner one after the other; either way the plan receives all their Results.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from sqlalchemy import Connection, Executable, Result

from mailbag.database_url import Dialect, dialect_of

if TYPE_CHECKING:  # the asyncio extension brings in the ORM: only async callers load it
    from sqlalchemy.ext.asyncio import AsyncConnection

T = TypeVar("T")
Params = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


@dataclass(frozen=True)
class Step:
    statement: Executable
    params: Params = None


@dataclass(frozen=True)
class _Question:
    """Yielded by `current_dialect` (option None) or `connection_option`: the runner sends
    back the dialect, or the option's value, not a Result."""

    option: str | None = None


DIALECT_QUESTION: Final = _Question()
NO_OPTIONS: Mapping[str, Any] = {}


@dataclass(frozen=True)
class Together:
    """Yielded by `together`: steps a runner may send at once, answered with a tuple of
    their Results in order. `last`: the plan yields nothing after them, so a runner that
    holds a transaction for this plan alone sends its COMMIT with them (`round_trip`)."""

    steps: tuple[Step, ...]
    last: bool = False


# What a plan receives is a Result for each Step, and the answer to each question. A
# Generator type cannot say that the answer depends on what was yielded, so Plan declares
# the common case (Results: every `(yield Step(...)).all()` stays checked), and each
# question declares its own answer in its function (mypy does not compare send types
# across `yield from`). `answering` is the only place that sends an answer into a plan.
Plan = Generator[Step | Together | _Question, Result[Any], T]
Steps = Generator[Step | Together, Result[Any], T]  # a plan whose questions are answered


def current_dialect() -> Generator[_Question, Dialect, Dialect]:
    """The dialect of the connection this plan runs on: `yield from current_dialect()`."""
    return (yield DIALECT_QUESTION)


def connection_option(name: str) -> Generator[_Question, Any, Any]:
    """The execution option `name` of the connection this plan runs on (None if unset)."""
    return (yield _Question(name))


def together(
    *steps: Step, last: bool = False
) -> Generator[Together, tuple[Result[Any], ...], tuple[Result[Any], ...]]:
    """Steps none of which needs another's answer, sent at once where the runner can:
    `a, b = yield from together(Step(...), Step(...))`. `last`: nothing follows them."""
    return (yield Together(steps, last))


def round_trip(batch: Together, *, in_transaction: bool) -> tuple[bool, bool]:
    """What a runner that holds a transaction for one plan sends with a batch: (BEGIN
    before it, COMMIT after it). A lone statement that is the plan's first and last goes
    with neither: one statement is atomic by itself (autocommit)."""
    alone = batch.last and len(batch.steps) == 1 and not in_transaction
    return (not in_transaction and not alone, batch.last and not alone)


def answering(plan: Plan[T], dialect: Dialect, options: Mapping[str, Any] = NO_OPTIONS) -> Steps[T]:
    """The plan's SQL steps, its questions answered with `dialect` and `options`."""
    answer: Result[Any]
    try:
        instruction = next(plan)
        while True:
            if isinstance(instruction, _Question):  # see Plan: a question's own answer
                found = dialect if instruction.option is None else options.get(instruction.option)
                answer = cast(Result[Any], found)
            else:
                answer = yield instruction
            instruction = plan.send(answer)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


_DIALECTS: dict[str, Dialect] = {}


def dialect_of_connection(conn: Connection | AsyncConnection) -> Dialect:
    """mailbag's dialect for a connection, whatever driver its engine uses."""
    name = conn.dialect.name
    if name not in _DIALECTS:  # looked up once per name: this runs for every plan
        _DIALECTS[name] = dialect_of(f"{name}://")
    return _DIALECTS[name]


def run(conn: Connection, plan: Plan[T]) -> T:
    """Run a plan on a sync connection, inside whatever transaction the caller holds."""
    steps = answering(plan, dialect_of_connection(conn), conn.get_execution_options())
    try:
        instruction = next(steps)
        while True:
            if isinstance(instruction, Together):  # one after the other
                batch = tuple(conn.execute(s.statement, s.params) for s in instruction.steps)
                instruction = steps.send(cast(Result[Any], batch))  # see Plan
            else:
                instruction = steps.send(conn.execute(instruction.statement, instruction.params))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def options_of(conn: AsyncConnection) -> Mapping[str, Any]:
    """The execution options of an async connection (the engine's and its own)."""
    return conn.sync_connection.get_execution_options() if conn.sync_connection else NO_OPTIONS


async def run_async(conn: AsyncConnection, plan: Plan[T]) -> T:
    """Run a plan on an async connection, inside whatever transaction the caller holds."""
    return await resume_async(conn, answering(plan, dialect_of_connection(conn), options_of(conn)))


async def resume_async(
    conn: AsyncConnection, steps: Steps[T], instruction: Step | Together | None = None
) -> T:
    """Answer a plan's steps from `conn`, from `instruction` on when the caller has taken
    the first one already (AsyncDatabase.run_at_once looks at it before it begins)."""
    try:
        if instruction is None:
            instruction = next(steps)
        while True:
            if isinstance(instruction, Together):  # one after the other
                batch = [await conn.execute(s.statement, s.params) for s in instruction.steps]
                instruction = steps.send(cast(Result[Any], tuple(batch)))  # see Plan
            else:
                result = await conn.execute(instruction.statement, instruction.params)
                instruction = steps.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
