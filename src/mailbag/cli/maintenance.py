"""Commands that keep the database in shape: the schema (`migrate`) and old rows (`purge`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer

from mailbag.cli.invocation import database, fail, prepare, settings


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
