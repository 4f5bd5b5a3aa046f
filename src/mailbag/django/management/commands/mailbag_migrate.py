"""manage.py mailbag_migrate: mailbag's schema (its own tables, not Django models) into the
Django database the outbox lives in. Run it where you run `manage.py migrate`."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from mailbag.django.commands import MailbagCommand, run


class Command(MailbagCommand):
    help = "Create or upgrade mailbag's tables in the Django database (like `mailbag migrate`)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--accept-new-key",
            action="store_true",
            help="Make the current mailbag SECRET_KEY the one workers must have.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from mailbag.cli.maintenance import migrate

        run(migrate, database=options["database"], accept_new_key=options["accept_new_key"])
