"""`mailbag tenants account`: a tenant's own provider account, which routes that name
`tenant` send its mail through (the same service the admin API and the console use).

A value on the command line is visible to every user of the machine (`ps`, shell history),
so give secrets as `--set api_key=@FILE` (the file's text, a trailing newline dropped),
`--set api_key=@-` (standard input), or every setting at once with `--from-file
FILE.toml|FILE.json` (`-`: standard input). `@@...` is a value that starts with `@`.
Nothing this prints ever shows a secret's value.

Exits: 2 for bad input (a kind, a key, a value, a file, a tenant), having written nothing;
1 for what cannot be done (no secret key, or not the one this database was first used
with; no account to show or remove; one sealed under another key).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from mailbag.cli.help import Command, group
from mailbag.cli.invocation import fail, on_async_engine, prepare, settings

if TYPE_CHECKING:
    from mailbag.services.tenant_accounts import TenantAccounts

T = TypeVar("T")
ACTOR = "operator:cli"
STDIN = "-"

account = group("A tenant's own provider account: its credentials, sealed, used by its routes.")

TENANT = Annotated[str, typer.Argument(metavar="TENANT", help="Tenant id or name.")]


def _service(action: Callable[[TenantAccounts], Awaitable[T]]) -> T:
    """Run one call of the accounts service; its errors become messages and exits."""
    from mailbag.services import tenant_accounts as accounts

    config = settings()
    try:
        return on_async_engine(lambda engine: action(accounts.TenantAccounts(engine, config)))
    except accounts.InvalidAccount as exc:
        fail(f"invalid account: {exc}")
    except (accounts.NoAccountKey, accounts.NoAccount, accounts.UnreadableAccount) as exc:
        fail(str(exc), code=1)


def _value(key: str, value: str, stdin: list[str]) -> str:
    """A --set value: itself, `@FILE`'s text, `@-` standard input's; `@@...` is `@...`."""
    from mailbag.cli.outbox import read_text

    if value.startswith("@@") or not value.startswith("@"):
        return value.removeprefix("@")
    if value == f"@{STDIN}":
        stdin.append(key)
        if len(stdin) > 1:
            fail(f"--set {key}=@-: standard input is {stdin[0]}'s already")
    text = read_text(f"--set {key}", value[1:])
    return text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")


def _from_file(name: str) -> dict[str, Any]:
    """A --from-file table: JSON for .json, TOML for .toml; from standard input (`-`), JSON
    when it starts with `{`. Errors say where, never what the file holds."""
    import tomllib

    from mailbag.cli.outbox import read_text

    text = read_text("--from-file", name)
    as_json = name.endswith(".json") or (name == STDIN and text.lstrip().startswith("{"))
    if not as_json and name != STDIN and not name.endswith(".toml"):
        fail(f"--from-file {name}: a .json or .toml file (or - for standard input)")
    try:
        table = json.loads(text) if as_json else tomllib.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"--from-file {name}: not JSON (line {exc.lineno}, column {exc.colno})")
    except tomllib.TOMLDecodeError as exc:  # its message says what and where, not the text
        fail(f"--from-file {name}: not TOML ({exc})")
    if not isinstance(table, dict):
        fail(f"--from-file {name}: not a table of settings")
    return table


def _table(kind: str | None, pairs: list[str], from_file: str | None) -> tuple[str, dict[str, Any]]:
    """The account's kind and settings from the options: --set wins over the file."""
    from mailbag.services.tenant_accounts import InvalidAccount, parse_pairs

    table = _from_file(from_file) if from_file else {}
    in_file = table.pop("kind", None)
    if kind is None:
        if not isinstance(in_file, str):
            fail("--kind: which provider the account is of (or `kind` in --from-file)")
        kind = in_file
    elif in_file is not None and in_file != kind:
        fail(f"--kind {kind} and the `kind` of --from-file {from_file} differ")
    try:
        given = parse_pairs(pairs)
    except InvalidAccount as exc:
        fail(f"invalid account: {exc}")
    stdin: list[str] = []
    table.update({key: _value(key, value, stdin) for key, value in given.items()})
    if not table:
        fail("no settings: give them with --set KEY=VALUE or --from-file FILE")
    return kind, table


@account.command("set", cls=Command)
def set_(
    tenant: TENANT,
    kind: Annotated[
        str | None,
        typer.Option(
            metavar="KIND",
            help="The provider: postmark, sendgrid, mailgun, resend, smtp and so on.",
        ),
    ] = None,
    pairs: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="A setting, named without its MAILBAG_KIND_ prefix (api_key=TOKEN, host=NAME), "
            "repeatable; "
            "VALUE @FILE reads a file, @- standard input (keep secrets off the command line).",
        ),
    ] = None,
    from_file: Annotated[
        str | None,
        typer.Option(
            metavar="FILE", help="Settings as a JSON or TOML table (- for standard input)."
        ),
    ] = None,
) -> None:
    """Give a tenant its own provider account, or replace the one it has with exactly this
    one (settings it left out are gone)."""
    from mailbag.clock import utcnow
    from mailbag.services.tenant_accounts import InvalidAccount, checked

    kind, table = _table(kind, pairs or [], from_file)
    try:  # before the database: nothing is written for a wrong kind or key
        checked(settings(), kind, table)
    except InvalidAccount as exc:
        fail(f"invalid account: {exc}")
    prepare(key=True)  # seal with the key every worker opens it with
    shown, created = _service(lambda svc: svc.put(tenant, kind, table, now=utcnow(), actor=ACTOR))
    verb = "gave" if created else "replaced"
    typer.echo(f"{verb} {shown.tenant_id} its own {shown.kind} account: {', '.join(shown.keys)}")


@account.command("show", cls=Command)
def show(tenant: TENANT) -> None:
    """A tenant's own account: its kind, each setting it sets (a secret as `set`, never its
    value), and who set it when."""
    prepare(key=True)
    shown = _service(lambda svc: svc.show(tenant))
    typer.echo(f"tenant\t{shown.tenant_id}")
    typer.echo(f"kind\t{shown.kind}")
    for key in shown.keys:
        typer.echo(f"{key}\t{shown.shown.get(key, 'set')}")
    typer.echo(f"updated\t{shown.updated_at:%Y-%m-%dT%H:%M:%SZ} by {shown.updated_by}")


@account.command("remove", cls=Command)
def remove(tenant: TENANT) -> None:
    """Take a tenant's own account away: routes that name `tenant` have none for it."""
    tenant_id = _service(lambda svc: svc.remove(tenant))
    typer.echo(f"removed {tenant_id}'s own account")


@account.command("list", cls=Command)
def list_() -> None:
    """Every tenant's own account: tenant, kind, when and by whom it was set (no settings)."""
    for found in _service(lambda svc: svc.listing()):
        typer.echo(
            f"{found.tenant_id}\t{found.kind}\t{found.updated_at:%Y-%m-%dT%H:%M:%SZ}"
            f"\t{found.updated_by}"
        )
