"""What every command shares in one invocation: its settings, read once; the schema policy;
the database; and how a command stops.

Exits: bad input (or settings) exits 2 with a message on stderr, having written nothing;
something the command needs but cannot have (a missing or stale schema, a missing or
different key, a database it cannot reach) exits 1 and says what to do.

Schema policy, in `prepare` alone: only `migrate` and `serve` change the schema; every
other command insists it is current and says to run `mailbag migrate` first (replicas and
scripts running side by side must not race to change it).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from mailbag.services.operations import Operations
    from mailbag.settings import Settings

T = TypeVar("T")
ACTOR = "operator:cli"  # the actor of the audit events operator actions write

_settings: Settings | None = None  # this invocation's, once a command asked for them


def begin() -> None:
    """A new invocation (the app's callback): its settings are read afresh."""
    global _settings
    _settings = None


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"mailbag: {message}", err=True)
    raise typer.Exit(code)


def settings(**overrides: Any) -> Settings:
    """The invocation's settings, read when a command first asks (never for --help). The
    command's own options override them: only its first call may give any."""
    global _settings
    if _settings is None:
        from mailbag.settings import Settings

        try:
            _settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
        except Exception as exc:  # pydantic's ValidationError or a bad URL: say it, don't trace
            fail(f"invalid settings: {exc}")
    return _settings


def prepare(*, upgrade: bool = False, key: bool = False) -> None:
    """Check what a command needs before it starts: the schema (migrated first with
    `upgrade`) and, for the long-running commands, the deployment key: present, and the
    one this database was first used with."""
    from mailbag import runtime

    try:
        if key:
            runtime.require_key(settings())
        runtime.ensure_schema(settings(), upgrade=upgrade)
        runtime.configure_hooks(settings())
        if key:
            runtime.check_key(settings())
    except runtime.CannotStart as exc:
        fail(str(exc), code=1)


def database() -> Engine:
    """An engine on a database whose schema is current."""
    from mailbag.store.database import make_engine

    prepare()
    return make_engine(settings().database_url)


def operations(action: Callable[[Operations], Awaitable[T]]) -> T:
    """Run one operator action (the same code the console and admin API run)."""
    import asyncio

    from mailbag.services.operations import Operations
    from mailbag.store.database import make_async_engine

    prepare()
    url, attempts = settings().database_url, settings().max_attempts

    async def main() -> T:
        engine = make_async_engine(url, null_pool=True)
        try:
            return await action(Operations(engine, default_attempts=attempts))
        finally:
            await engine.dispose()

    return asyncio.run(main())


def parse_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        fail(f"{value!r} is not a message id (a UUID)")
