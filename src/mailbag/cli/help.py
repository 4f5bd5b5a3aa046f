"""How `mailbag --help` and every command's help read: click's conventions, not Python's.

Typer shows an option's Python type as its value (`--to <list[str]>`, `--limit <int
range>`), a required argument in braces (`{file}`) and a command's summary cut to the
terminal (`Create or upgrade the database schema (`serve` does this...`). Here:
- every option and argument names its value by `metavar=` (ADDRESS, N, FILE, SECONDS...;
  tests/test_cli_help.py fails for one that does not);
- arguments read as click writes them: `FILE` when required, `[FILE]` when not;
- a group lists each command with its whole first sentence, wrapped, never cut.

Every group is made with `group()` and every command with `cls=Command`.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

NEVER_CUT = 10_000  # characters: a summary is its command's whole first sentence


class Group(TyperGroup):
    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(NEVER_CUT)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class Command(TyperCommand):
    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = argument_name(param)
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments, options = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":  # its name alone, without a Python type
                arguments.append((argument_name(param), record[1]))
            else:
                options.append(record)
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def argument_name(param: Any) -> str:
    return str(param.metavar or param.name.upper())


def group(help: str, **options: Any) -> typer.Typer:
    """A group of commands (`mailbag tenants ...`): its help when given no command."""
    return typer.Typer(help=help, cls=Group, no_args_is_help=True, rich_markup_mode=None, **options)
