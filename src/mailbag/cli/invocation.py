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
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

    from mailbag.services.operations import Operations
    from mailbag.settings import Settings

T = TypeVar("T")
ACTOR = "operator:cli"  # the actor of the audit events operator actions write

_settings: Settings | None = None  # this invocation's, once a command asked for them


def begin(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=show_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """A new invocation (the app's callback): its settings are read afresh."""
    global _settings
    _settings = None


def show_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        typer.echo(f"mailbag {version('mailbag')}")
        raise typer.Exit()


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"mailbag: {message}", err=True)
    raise typer.Exit(code)


def settings(**overrides: Any) -> Settings:
    """The invocation's settings, read when a command first asks (never for --help). The
    command's own options override them: only its first call may give any."""
    global _settings
    if _settings is None:
        from mailbag.settings import InvalidSettings, read_settings

        try:
            _settings = read_settings(**{k: v for k, v in overrides.items() if v is not None})
        except InvalidSettings as exc:  # names each bad setting, never its value
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
            runtime.require_providers(settings())
        runtime.ensure_schema(settings(), upgrade=upgrade)
        if key:
            runtime.check_key(settings())
    except runtime.CannotStart as exc:
        fail(str(exc), code=1)


def database() -> Engine:
    """An engine on a database whose schema is current."""
    from mailbag.store.database import make_engine

    prepare()
    return make_engine(settings().database_url, execution_options=_engine_options())


def _engine_options() -> dict[str, Any]:
    """The execution options this invocation's plans read (hooks' fan-out, erasure key)."""
    from mailbag.services.erasure import engine_options

    return engine_options(settings())


def operations(action: Callable[[Operations], Awaitable[T]]) -> T:
    """Run one operator action (the same code the console and admin API run)."""
    from mailbag.services.operations import Operations

    attempts = settings().max_attempts
    return on_async_engine(lambda engine: action(Operations(engine, default_attempts=attempts)))


def on_async_engine(action: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    """Run a service that is async (as the API's are) on a database whose schema is current.
    A tenant it does not know (named by an option or argument) exits 2, naming it."""
    import asyncio

    from mailbag.services.tenants import UnknownTenant
    from mailbag.store.database import make_async_engine

    prepare()
    url = settings().database_url

    async def main() -> T:
        engine = make_async_engine(url, null_pool=True, execution_options=_engine_options())
        try:
            return await action(engine)
        finally:
            await engine.dispose()

    try:
        return asyncio.run(main())
    except UnknownTenant as exc:
        fail(str(exc))


def tenant_id(engine: Engine, tenant: str) -> str:
    """The id of the tenant an option or argument names (its id or its name); exit 2,
    naming it, if there is none."""
    from mailbag.services.tenants import UnknownTenant, resolve

    try:
        return resolve(engine, tenant)
    except UnknownTenant as exc:
        fail(str(exc))


def parse_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        fail(f"{value!r} is not a message id (a UUID)")
