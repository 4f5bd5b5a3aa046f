"""manage.py mailbag_worker: the mailbag worker on the Django database, with settings from
settings.MAILBAG and MAILBAG_* environment variables. Stops (drained) on SIGTERM/SIGINT."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from mailbag.django.commands import MailbagCommand, run


class Command(MailbagCommand):
    help = "Send email from the outbox until SIGTERM/SIGINT (like `mailbag worker`)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--concurrency", type=int, help="Sends in flight at once.")
        parser.add_argument("--batch-size", type=int, help="Messages claimed per round.")
        parser.add_argument("--id", dest="worker_id", help="Worker id (default host:pid).")
        parser.add_argument("--metrics-port", type=int, help="Serve Prometheus metrics here.")

    def handle(self, *args: Any, **options: Any) -> None:
        from mailbag.cli.run import worker

        run(
            worker,
            database=options["database"],
            settings={
                name: options[name]
                for name in ("concurrency", "batch_size", "worker_id", "metrics_port")
            },
        )
