"""Commands on the outbox: enqueue, watch it (stats, top), and the operator's actions on its
messages and on the suppression list (the same services the console and admin API call)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mailbag.cli.help import Command, group
from mailbag.cli.invocation import (
    ACTOR,
    database,
    fail,
    on_async_engine,
    operations,
    parse_id,
    settings,
    tenant_id,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rich.table import Table
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

    from mailbag.domain.content import Attachment
    from mailbag.domain.message import NewMessage
    from mailbag.services.operations import Health, Operations
    from mailbag.settings import Settings


def option(metavar: str | None, help: str, *flags: str) -> Any:
    """A typer option that names its value (`metavar`, tests/test_cli_help.py) and says
    what it is for: the options of `enqueue` below, one line each."""
    return typer.Option(*flags, metavar=metavar, help=help)


# The options of `enqueue`, named once so its signature stays short.
TO = Annotated[list[str], option("ADDRESS", "Recipient address (repeatable).")]
TEMPLATE = Annotated[str | None, option("NAME", "Template name, e.g. welcome (or --html/--text).")]
DATA = Annotated[str, option("JSON", "Template data as a JSON object.")]
KEY = Annotated[str | None, option("KEY", "Idempotency key: the same key, the same message.")]
SUBJECT = Annotated[
    str | None,
    option("TEXT", "Subject: required with --html/--text; else overrides the template's."),
]
HTML = Annotated[
    str | None,
    option(
        "HTML|@FILE",
        "Ready-made HTML body: the HTML itself, or @FILE to read a UTF-8 file "
        "(@- reads standard input).",
    ),
]
TEXT = Annotated[
    str | None,
    option(
        "TEXT|@FILE",
        "Ready-made text body: the text itself, or @FILE to read a UTF-8 file "
        "(default: made from --html).",
    ),
]
INLINE_CSS = Annotated[
    bool, option(None, "Move the rules of the HTML's style elements into style attributes.")
]
ATTACH = Annotated[
    list[str] | None,
    option(
        "FILE",
        "Attach a file (repeatable): FILE, FILE;type=MIME/TYPE (default: guessed from the "
        "name), FILE;cid=ID for an inline image the HTML shows as cid:ID.",
    ),
]
TO_NAME = Annotated[str | None, option("NAME", "Display name of a single --to.")]
CC = Annotated[list[str] | None, option("ADDRESS", "Cc address (repeatable).")]
BCC = Annotated[list[str] | None, option("ADDRESS", "Bcc address (repeatable; in no header).")]
REPLY_TO = Annotated[list[str] | None, option("ADDRESS", "Reply-To address (repeatable).")]
SENDER = Annotated[
    str | None,
    option(
        "ADDRESS",
        "Sender address: one of the tenant's sender identities (default FROM_EMAIL).",
        "--from",
    ),
]
FROM_NAME = Annotated[str | None, option("NAME", "Sender display name.")]
OWNER = Annotated[str, option("TENANT", "Tenant the message belongs to: its id or its name.")]
HEADER = Annotated[list[str] | None, option("HEADER", "Extra header 'Name: value' (repeatable).")]
TAG = Annotated[list[str] | None, option("TAG", "Tag (repeatable).")]
SEND_AT = Annotated[str | None, option("TIME", "ISO 8601 time to send at (with zone).")]
EXPIRES_IN = Annotated[
    str | None, option("DURATION", "Don't send after this long from now (e.g. 30m, 2h, 1d).")
]
PRIORITY = Annotated[str, option("PRIORITY", "high, normal or low: higher is claimed first.")]
UNSUBSCRIBE_URL = Annotated[str | None, option("URL", "https:// one-click List-Unsubscribe URL.")]
UNSUBSCRIBE_MAILTO = Annotated[
    str | None, option("ADDRESS", "Address for a mailto: List-Unsubscribe.")
]
LOCALE = Annotated[
    str | None, option("TAG", "BCP 47 locale of the template (fr-CA, then fr, then its default).")
]


def enqueue(
    to: TO,
    template: TEMPLATE = None,
    data: DATA = "{}",
    key: KEY = None,
    subject: SUBJECT = None,
    html: HTML = None,
    text: TEXT = None,
    inline_css: INLINE_CSS = False,
    attach: ATTACH = None,
    to_name: TO_NAME = None,
    cc: CC = None,
    bcc: BCC = None,
    reply_to: REPLY_TO = None,
    sender: SENDER = None,
    from_name: FROM_NAME = None,
    tenant: OWNER = "default",
    header: HEADER = None,
    tag: TAG = None,
    send_at: SEND_AT = None,
    expires_in: EXPIRES_IN = None,
    priority: PRIORITY = "normal",
    unsubscribe_url: UNSUBSCRIBE_URL = None,
    unsubscribe_mailto: UNSUBSCRIBE_MAILTO = None,
    locale: LOCALE = None,
) -> None:
    """Put one email into the outbox and print its id."""
    from dataclasses import replace

    from mailbag import templates
    from mailbag.domain.message import InvalidMessage
    from mailbag.services import intake

    config = settings()
    # Each option is read (and refused, exit 2) in the order of the fields it makes.
    template_data = json_option("--data", data)
    headers = header_options(header or [])
    when = send_at_option(send_at)
    expires_at = expires_in_option(expires_in)
    files = [attachment(spec, config.max_attachment_bytes) for spec in attach or []]
    try:
        message = intake.Rules.of(config).message(
            to=to if len(to) > 1 else to[0],
            to_name=to_name,
            cc=cc,
            bcc=bcc,
            reply_to=reply_to,
            from_address=sender,
            from_name=from_name,
            template=template,
            data=template_data or None,
            subject=subject,
            html=body("--html", html) if html is not None else None,
            text=body("--text", text) if text is not None else None,
            inline_css=inline_css,
            attachments=files,
            idempotency_key=key,
            tenant_id=tenant,
            headers=headers,
            tags=tag or [],
            send_at=when,
            expires_at=expires_at,
            priority=priority,
            unsubscribe_url=unsubscribe_url,
            unsubscribe_mailto=unsubscribe_mailto,
            locale=locale,
        )
    except (InvalidMessage, templates.TemplateError) as exc:
        fail(f"invalid message: {exc}")
    engine = database()
    message = replace(message, tenant_id=tenant_id(engine, tenant))  # checked, now resolved
    try:
        written = enqueue_once(message) if key is not None else write_one(engine, message, config)
    except InvalidMessage as exc:  # a `from` that is not the tenant's: nothing was written
        fail(f"invalid message: {exc}")
    typer.echo(written)


def json_option(option: str, value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        fail(f"{option} is not valid JSON: {exc}")


def header_options(given: list[str]) -> dict[str, str]:
    """--header 'Name: value' options as a mapping."""
    headers: dict[str, str] = {}
    for item in given:
        name, sep, value = item.partition(":")
        if not sep:
            fail(f"--header {item!r} must look like 'Name: value'")
        headers[name.strip()] = value.strip()
    return headers


def send_at_option(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        fail(f"--send-at {value!r} is not an ISO 8601 time")


def expires_in_option(value: str | None) -> datetime | None:
    from mailbag.cli.maintenance import parse_age
    from mailbag.clock import utcnow

    return None if value is None else utcnow() + parse_age(value)


def write_one(engine: Engine, message: NewMessage, config: Settings) -> str:
    """A checked message without a key into the outbox; its id."""
    from mailbag.services import intake
    from mailbag.services.outbox import write_many

    with engine.begin() as conn:
        (result,) = write_many(
            conn,
            [message],
            book=intake.book(config),
            max_attempts=config.max_attempts,
            actor="cli",
            ready_from=config.ready_from,
        )
    return str(result.message.id)


def enqueue_once(message: NewMessage) -> str:
    """An enqueue with a key, as POST /v1/messages does one (the same service, the same
    fingerprint, the same record): the key and the same message again give the first id;
    the key with another message exits 2 with the API's words for its 409."""
    from mailbag.clock import utcnow
    from mailbag.services import idempotency
    from mailbag.services.messages import Messages

    key = message.idempotency_key
    try:
        idempotency.check_key(key)
    except idempotency.InvalidIdempotencyKey as exc:
        fail(f"--key: {exc}")

    async def create(engine: AsyncEngine) -> idempotency.Response:
        return await Messages(engine, settings()).create(
            key=key, message=message, now=utcnow(), actor="cli"
        )

    try:
        answer = on_async_engine(create)
    except idempotency.KeyReused as exc:
        fail(f"--key {key!r}: {exc}; nothing was written")
    if answer.replayed:
        typer.echo(f"(key {key!r} already enqueued this message)", err=True)
    return str(answer.body["id"])


def body(option: str, value: str) -> str:
    """A --html/--text value: the content itself, or `@FILE` (as curl's `-d @FILE`; `@-`
    is standard input, `@@...` content that starts with `@`). A bare value naming a file
    that exists is read as well, as these options did before, with a warning."""
    if value.startswith("@@"):
        return value[1:]
    if value.startswith("@"):
        return read_text(option, value[1:])
    if _is_file(value):
        typer.echo(
            f"mailbag: warning: {option} {value} reads the file {value}; write "
            f"{option} @{value} (a bare value will be taken as the content itself)",
            err=True,
        )
        return read_text(option, value)
    return value


def _is_file(value: str) -> bool:
    if "\n" in value or len(value) > 4096:  # content, not a path
        return False
    try:
        path = Path(value)
        return path.exists() and not path.is_dir()  # /dev/null and pipes included
    except (OSError, ValueError):  # a name no file system has (too long, a NUL)
        return False


def read_text(option: str, name: str) -> str:
    import sys

    try:
        raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        return raw.decode("utf-8")
    except OSError as exc:
        fail(f"{option} @{name}: {exc.strerror or exc}")
    except UnicodeDecodeError:
        fail(f"{option} @{name} is not UTF-8 text")


def attachment(spec: str, max_bytes: int) -> Attachment:
    """An --attach value (FILE[;type=MIME/TYPE][;cid=ID]) read into an Attachment; a file
    over the limit is refused before it is read."""
    from mailbag.domain.content import Attachment, guess_content_type

    name, *params = spec.split(";")
    options: dict[str, str] = {}
    for param in params:
        option, sep, value = param.partition("=")
        if not sep or option.strip() not in ("type", "cid") or not value.strip():
            fail(f"--attach {spec!r}: give FILE, FILE;type=MIME/TYPE or FILE;cid=ID")
        options[option.strip()] = value.strip()
    path = Path(name)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            fail(
                f"--attach {name}: the file is {size} bytes; the limit for one attachment "
                f"is {max_bytes} (MAILBAG_MAX_ATTACHMENT_BYTES)"
            )
        content = path.read_bytes()
    except OSError as exc:
        fail(f"--attach {name}: {exc.strerror or exc}")
    content_type = options.get("type") or guess_content_type(path.name)
    return Attachment(path.name, content_type, content, options.get("cid"))


def health_table(health: Health) -> Table:
    from rich.table import Table

    table = Table(title="mailbag outbox", show_header=True, header_style="bold")
    table.add_column("state")
    table.add_column("messages", justify="right")
    for state, count in health.counts.items():
        table.add_row(state, str(count))
    age = health.oldest_due_age_seconds
    table.add_section()
    table.add_row("oldest due (age)", f"{age:.1f} s" if age is not None else "-")
    table.add_row("sent, last hour", str(sum(health.sent_per_5_minutes)))
    rate = health.provider_error_rate
    table.add_row("provider error rate", f"{rate:.1%}" if rate is not None else "-")
    table.add_row("unmatched provider events", str(health.unmatched_provider_events))
    table.add_row("suppressed addresses", str(health.suppressions))
    return table


def stats(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Counts by state, the oldest due message's age, sends and errors in the last hour."""
    from mailbag.clock import utcnow

    health = operations(lambda ops: ops.health(utcnow()))
    if as_json:
        typer.echo(json.dumps(health.as_dict()))
    else:
        from rich.console import Console  # only for the table: scripts read --json

        Console().print(health_table(health))


def top(
    interval: Annotated[
        float, typer.Option(metavar="SECONDS", help="Seconds between updates.")
    ] = 2.0,
) -> None:
    """`stats`, live, until Ctrl-C."""
    import asyncio
    import contextlib

    from rich.live import Live

    from mailbag.clock import utcnow

    async def watch(ops: Operations) -> None:
        with Live(health_table(await ops.health(utcnow())), refresh_per_second=4) as live:
            while True:
                await asyncio.sleep(interval)
                live.update(health_table(await ops.health(utcnow())))

    with contextlib.suppress(KeyboardInterrupt):
        operations(watch)


def requeue(
    message_id: Annotated[
        str | None, typer.Argument(metavar="MESSAGE_ID", help="The message to send again.")
    ] = None,
    state: Annotated[
        str | None,
        typer.Option(
            metavar="STATE", help="Requeue every message in this state (unknown or dead)."
        ),
    ] = None,
) -> None:
    """Send unknown or dead messages again (an operator's decision, never automatic)."""
    from mailbag.clock import utcnow
    from mailbag.domain import states
    from mailbag.domain.message import Filter
    from mailbag.domain.states import Status

    allowed = {s.value for s in states.sources(states.Action.REQUEUE)}
    if (message_id is None) == (state is None):
        fail("give a message id or --state, not both")
    if state is not None and state not in allowed:
        fail(f"--state must be one of {sorted(allowed)}")
    ids = [parse_id(message_id)] if message_id is not None else None
    where = Filter(status=Status(state)) if state is not None else None
    changed = operations(
        lambda ops: ops.requeue(message_ids=ids, where=where, now=utcnow(), actor=ACTOR)
    )
    if message_id is not None and not changed:
        fail(f"message {message_id} is not unknown or dead (or does not exist)", code=1)
    typer.echo(f"requeued {len(changed)} message(s)")


def cancel(
    message_id: Annotated[str, typer.Argument(metavar="MESSAGE_ID", help="A pending message.")],
) -> None:
    """Withdraw a pending message before any attempt."""
    from mailbag.clock import utcnow
    from mailbag.services.operations import NotAllowed

    target = parse_id(message_id)
    try:
        operations(lambda ops: ops.cancel(message_id=target, now=utcnow(), actor=ACTOR))
    except NotAllowed:
        fail(f"message {message_id} is not pending (or does not exist)", code=1)
    typer.echo(f"cancelled {message_id}")


def resolve(
    message_id: Annotated[str, typer.Argument(metavar="MESSAGE_ID", help="An unknown message.")],
    evidence: Annotated[
        str, typer.Option(metavar="TEXT", help="What shows the outcome (required).")
    ],
    sent: Annotated[
        bool, typer.Option("--sent/--failed", help="Was it accepted by the provider?")
    ] = True,
    provider_message_id: Annotated[
        str | None, typer.Option(metavar="ID", help="The provider's id.")
    ] = None,
) -> None:
    """Settle an unknown message as sent or failed, from evidence."""
    from mailbag.clock import utcnow
    from mailbag.services.operations import NotAllowed

    target = parse_id(message_id)
    if not evidence.strip():
        fail("--evidence must say what shows the outcome")
    try:
        operations(
            lambda ops: ops.resolve(
                message_id=target,
                sent=sent,
                evidence=evidence,
                now=utcnow(),
                actor=ACTOR,
                provider_message_id=provider_message_id,
            )
        )
    except NotAllowed:
        fail(f"message {message_id} is not unknown (or does not exist)", code=1)
    typer.echo(f"{message_id} is now {'sent' if sent else 'failed'}")


def reconcile() -> None:
    """Look for evidence about every unknown message now (workers do this regularly)."""
    from mailbag.clock import utcnow
    from mailbag.services.reconciliation import Reconciler
    from mailbag.worker import fleet

    config = settings()

    async def once(ops: Operations) -> Mapping[str, int]:
        members = fleet.from_settings(config).members
        try:
            reconciler = Reconciler(
                ops.engine,
                providers=members,
                flag_after=timedelta(minutes=config.reconcile_flag_after_minutes),
            )
            return await reconciler.run_once(utcnow(), message_domain=config.message_id_host)
        finally:
            for provider in members.values():
                await provider.aclose()

    typer.echo(json.dumps(dict(operations(once))))


suppressions = group("The suppression list: addresses a tenant never sends to.")


TENANT = Annotated[str, typer.Argument(metavar="TENANT", help="Tenant id or name (or `default`).")]
ADDRESS = Annotated[str, typer.Argument(metavar="ADDRESS", help="The email address.")]


@suppressions.command("list", cls=Command)
def suppressions_list(
    tenant: Annotated[
        str | None, typer.Option(metavar="TENANT", help="Only this tenant's (id or name).")
    ] = None,
) -> None:
    """Suppressed addresses: tenant, address, reason, since."""
    from mailbag.services.tenants import resolve_async

    async def listing(ops: Operations) -> list[Any]:  # Suppressions (the CLI sees no store)
        only = await resolve_async(ops.engine, tenant)
        return await ops.suppressions(tenant_id=only, limit=1000)

    for item in operations(listing):
        typer.echo(f"{item.tenant_id}\t{item.email}\t{item.reason}\t{item.created_at:%Y-%m-%d}")


@suppressions.command("add", cls=Command)
def suppressions_add(tenant: TENANT, email: ADDRESS) -> None:
    """Never send to this address for this tenant."""
    from mailbag.clock import utcnow
    from mailbag.services.tenants import resolve_async

    async def add(ops: Operations) -> bool:
        owner = await resolve_async(ops.engine, tenant)
        return await ops.suppress(tenant_id=owner, email=email, now=utcnow())

    try:
        added = operations(add)
    except ValueError as exc:
        fail(f"invalid address: {exc}")
    typer.echo("suppressed" if added else "already suppressed")


@suppressions.command("remove", cls=Command)
def suppressions_remove(tenant: TENANT, email: ADDRESS) -> None:
    """Send to this address again."""
    from mailbag.services.tenants import resolve_async

    async def remove(ops: Operations) -> bool:
        owner = await resolve_async(ops.engine, tenant)
        return await ops.unsuppress(tenant_id=owner, email=email)

    if not operations(remove):
        fail(f"{email} is not suppressed for {tenant}", code=1)
    typer.echo("removed")
