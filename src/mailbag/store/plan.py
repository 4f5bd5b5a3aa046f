"""Store operations are written once, as plans, and run on a sync or an async connection.

A plan is a generator that yields SQL steps and receives each step's result; it returns the
operation's answer. The plan never touches a connection, so the same SQL serves the CLI's
sync `Connection`, the worker's and API's `AsyncConnection`, a caller's own transaction, and
the recorder that writes docs/sql (store/sqldocs.py).

A plan whose SQL differs between databases asks its runner which one it runs on
(`dialect = yield from current_dialect()`): the runner answers from its connection, so no
caller ever passes a dialect along. Every runner drives a plan through `answering`, which
answers that question and hands the runner the SQL steps only; `run` and `run_async` differ
by the `await` and nothing else.
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


class _DialectQuestion:
    """Yielded by `current_dialect`: the runner sends back the dialect, not a Result."""

    def __repr__(self) -> str:
        return "DIALECT_QUESTION"


DIALECT_QUESTION: Final = _DialectQuestion()

# What a plan receives is a Result for each Step, and the Dialect for DIALECT_QUESTION. A
# Generator type cannot say that the answer depends on what was yielded, so Plan declares
# the common case (Results: every `(yield Step(...)).all()` stays checked), and the one
# question declares its own answer in `current_dialect` (mypy does not compare send types
# across `yield from`). `answering` is the only place that sends a Dialect into a plan.
Plan = Generator[Step | _DialectQuestion, Result[Any], T]
Steps = Generator[Step, Result[Any], T]  # a plan whose dialect questions are answered


def current_dialect() -> Generator[_DialectQuestion, Dialect, Dialect]:
    """The dialect of the connection this plan runs on: `yield from current_dialect()`."""
    return (yield DIALECT_QUESTION)


def answering(plan: Plan[T], dialect: Dialect) -> Steps[T]:
    """The plan's SQL steps, its dialect questions answered with `dialect`."""
    answer: Result[Any]
    try:
        instruction = next(plan)
        while True:
            if isinstance(instruction, _DialectQuestion):
                answer = cast(Result[Any], dialect)  # see Plan: a question's answer is a Dialect
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
    steps = answering(plan, dialect_of_connection(conn))
    try:
        step = next(steps)
        while True:
            step = steps.send(conn.execute(step.statement, step.params))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def run_async(conn: AsyncConnection, plan: Plan[T]) -> T:
    """Run a plan on an async connection, inside whatever transaction the caller holds."""
    steps = answering(plan, dialect_of_connection(conn))
    try:
        step = next(steps)
        while True:
            step = steps.send(await conn.execute(step.statement, step.params))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
