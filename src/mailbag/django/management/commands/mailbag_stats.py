"""manage.py mailbag_stats: the outbox's counts by state and its health (like `mailbag
stats`), written to standard output."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from mailbag.django.commands import MailbagCommand, run


class Command(MailbagCommand):
    help = "Counts by state, the oldest due message's age, sends and errors in the last hour."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--json", action="store_true", help="Machine-readable output.")

    def handle(self, *args: Any, **options: Any) -> None:
        from mailbag.cli.outbox import stats

        run(stats, database=options["database"], as_json=options["json"])
