"""Commands that keep the database in shape: the schema (`migrate`), old rows (`purge`) and
one person's data (`erase`)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from mailbag.cli.invocation import database, fail, on_async_engine, prepare, settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


def migrate(
    accept_new_key: Annotated[
        bool,
        typer.Option(
            help="Make the current secret key the one serve, api and worker must have "
            "(after changing it on purpose; unconfirmed verification codes and console "
            "sessions end)."
        ),
    ] = False,
) -> None:
    """Create or upgrade the database schema (`serve` does this itself; every other command
    needs it done). Safe to run from several places at once: a database lock serializes it."""
    from mailbag import runtime
    from mailbag.store import migrate as migrations

    prepare(upgrade=True)
    typer.echo(f"schema at revision {migrations.HEAD}")
    if accept_new_key:
        try:
            runtime.require_key(settings())
            runtime.accept_new_key(settings())
        except runtime.CannotStart as exc:
            fail(str(exc), code=1)
        typer.echo(
            "mailbag: warning: the database now expects the current secret key; verification "
            "codes not yet confirmed and console sessions made with the old key no longer "
            "work. Give every API and worker replica this key.",
            err=True,
        )


def parse_age(value: str) -> timedelta:
    from mailbag.domain import spans

    try:
        return spans.parse(value)
    except ValueError as exc:
        fail(str(exc))


def purge(
    older_than: Annotated[
        str, typer.Option(metavar="AGE", help="Age like 30d, 12h or 90m.")
    ] = "30d",
) -> None:
    """Delete finished messages (sent, failed, dead, cancelled, expired) last changed before
    the cutoff, and the attachments no message carries any more."""
    from mailbag.clock import utcnow
    from mailbag.services import maintenance

    age = parse_age(older_than)
    now = utcnow()
    purged = maintenance.purge(database(), older_than=now - age, now=now)
    typer.echo(
        f"purged {purged.messages} message(s), {purged.records} expired idempotency "
        f"record(s) and {purged.attachments} unused attachment(s)"
    )


def erase(
    address: Annotated[str, typer.Argument(metavar="ADDRESS", help="The person's address.")],
    tenant: Annotated[
        str | None,
        typer.Option(metavar="TENANT", help="Only this tenant's data (id or name); default: all."),
    ] = None,
    wait: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="How long to wait for messages a worker is sending right now (default: the "
            "lease, LEASE_SECONDS, and a margin).",
        ),
    ] = -1.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the erasure as JSON.")] = False,
) -> None:
    """Erase one person's data: every message, event, hook delivery, idempotency answer and
    verification that quotes the address loses it and its personal content, in chunks; the
    address stays suppressed by its keyed hash (`suppressions remove` lifts it). Run it
    again after an interruption: it resumes."""
    import asyncio
    import json
    import time

    from mailbag.domain.erasure import State
    from mailbag.services.erasure import (
        Erasures,
        InvalidAddress,
        NoErasureKey,
        Outcome,
        checked_address,
        describe,
        erasure_key,
    )

    try:
        checked_address(address)  # before anything is opened or written
    except InvalidAddress as exc:
        fail(str(exc))
    config = settings()
    patience = config.lease_seconds + 30 if wait < 0 else wait

    async def run(engine: AsyncEngine) -> Outcome:
        erasures = Erasures(engine, erasure_key(config))
        deadline = time.monotonic() + patience
        while True:
            outcome = await erasures.run(address, tenant=tenant, actor="operator:cli")
            if outcome.erasure.state != State.WAITING or time.monotonic() >= deadline:
                return outcome
            await asyncio.sleep(min(1.0, config.lease_seconds / 10))

    try:
        outcome = on_async_engine(run)
    except NoErasureKey as exc:
        fail(str(exc), code=1)
    shown = describe(outcome.erasure, held=outcome.held)
    if as_json:
        typer.echo(json.dumps(shown))
    else:
        counts = ", ".join(f"{n} {table}" for table, n in sorted(shown["progress"].items()))
        typer.echo(f"erasure {shown['id']}: {shown['state']} ({counts or 'nothing found'})")
    if outcome.erasure.state != State.DONE:
        fail(
            f"{outcome.held} message(s) are being sent right now; run `mailbag erase` again "
            "once their lease ends (the erasure resumes)",
            code=1,
        )
