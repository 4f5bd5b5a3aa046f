"""The management commands run the `mailbag` command's own code (mailbag.cli), with
settings made from Django's (conf.py): one door for what `mailbag migrate`, `worker` and
`stats` do, whichever command line starts them.

Exits are the mailbag command's: its message on stderr, then CommandError with its exit
status (2 for bad settings, 1 for what it needs but cannot have).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from mailbag.django import conf


class MailbagCommand(BaseCommand):  # type: ignore[misc]  # Django ships no types
    """A management command that runs one `mailbag` command on a Django database."""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            default=None,
            help="The DATABASES alias of the outbox (default: MAILBAG['DATABASE'] or 'default').",
        )


def run(
    command: Callable[..., None],
    *,
    database: str | None,
    settings: dict[str, Any] | None = None,
    **arguments: Any,
) -> None:
    """Run a mailbag CLI command with this project's settings (`settings` override them, as
    the command's own options do on the command line)."""
    from mailbag.cli import invocation

    try:
        given = conf.settings_kwargs(conf.database_alias(database), **(settings or {}))
    except ImproperlyConfigured as exc:
        raise CommandError(str(exc), returncode=2) from exc
    invocation.begin()
    try:
        invocation.settings(**given)  # the invocation's settings: every later call reads them
        command(**arguments)
    except typer.Exit as exc:
        if exc.exit_code:
            raise CommandError(
                f"mailbag {command.__name__} stopped (see above)", returncode=exc.exit_code
            ) from None
    finally:
        invocation.begin()
