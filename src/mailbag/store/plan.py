"""Store operations are written once, as plans, and run on a sync or an async connection.

A plan is a generator that yields SQL steps and receives each step's result; it returns the
operation's answer. The plan never touches a connection, so the same SQL serves the CLI's
sync `Connection`, the worker's and API's `AsyncConnection`, and a caller's own transaction.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Executable, Result

if TYPE_CHECKING:  # the asyncio extension brings in the ORM: only async callers load it
    from sqlalchemy.ext.asyncio import AsyncConnection

T = TypeVar("T")
Params = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


@dataclass(frozen=True)
class Step:
    statement: Executable
    params: Params = None


Plan = Generator[Step, Result[Any], T]


def run(conn: Connection, plan: Plan[T]) -> T:
    """Run a plan on a sync connection, inside whatever transaction the caller holds."""
    try:
        step = next(plan)
        while True:
            result = conn.execute(step.statement, step.params)
            step = plan.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def run_async(conn: AsyncConnection, plan: Plan[T]) -> T:
    """Run a plan on an async connection, inside whatever transaction the caller holds."""
    try:
        step = next(plan)
        while True:
            result = await conn.execute(step.statement, step.params)
            step = plan.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
