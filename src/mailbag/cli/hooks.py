"""`mailbag hooks`: event hook endpoints and their deliveries (issue 12)."""

from __future__ import annotations

import typer

hooks = typer.Typer(
    help="Event hooks: signed HTTP POSTs of message events to your endpoints.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
