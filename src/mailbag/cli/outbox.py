"""Commands on the outbox: enqueue, watch it (stats, top), and the operator's actions on its
messages and on the suppression list (the same services the console and admin API call)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mailbag.cli.invocation import ACTOR, database, fail, operations, parse_id, settings

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rich.table import Table

    from mailbag.domain.content import Attachment
    from mailbag.services.operations import Health, Operations


def enqueue(
    to: Annotated[list[str], typer.Option(help="Recipient address (repeatable).")],
    template: Annotated[
        str | None, typer.Option(help="Template name, e.g. welcome (or --html/--text).")
    ] = None,
    data: Annotated[str, typer.Option(help="Template data as a JSON object.")] = "{}",
    key: Annotated[
        str | None, typer.Option(help="Idempotency key: the same key, the same message.")
    ] = None,
    subject: Annotated[
        str | None,
        typer.Option(help="Subject: required with --html/--text; else overrides the template's."),
    ] = None,
    html: Annotated[
        Path | None, typer.Option(help="Ready-made HTML body, from this UTF-8 file.")
    ] = None,
    text: Annotated[
        Path | None,
        typer.Option(help="Ready-made text body, from this UTF-8 file (default: from --html)."),
    ] = None,
    inline_css: Annotated[
        bool, typer.Option(help="Move the HTML's <style> rules into style attributes.")
    ] = False,
    attach: Annotated[
        list[str] | None,
        typer.Option(
            help="Attach a file (repeatable): FILE, FILE;type=MIME/TYPE (default: guessed "
            "from the name), FILE;cid=ID for an inline image the HTML shows as cid:ID."
        ),
    ] = None,
    to_name: Annotated[str | None, typer.Option(help="Display name of a single --to.")] = None,
    cc: Annotated[list[str] | None, typer.Option(help="Cc address (repeatable).")] = None,
    bcc: Annotated[
        list[str] | None, typer.Option(help="Bcc address (repeatable; in no header).")
    ] = None,
    reply_to: Annotated[
        list[str] | None, typer.Option(help="Reply-To address (repeatable).")
    ] = None,
    sender: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Sender address: one of the tenant's sender identities (default FROM_EMAIL).",
        ),
    ] = None,
    from_name: Annotated[str | None, typer.Option(help="Sender display name.")] = None,
    tenant: Annotated[str, typer.Option(help="Tenant the message belongs to.")] = "default",
    header: Annotated[
        list[str] | None, typer.Option(help="Extra header 'Name: value' (repeatable).")
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Tag (repeatable).")] = None,
    send_at: Annotated[
        str | None, typer.Option(help="ISO 8601 time to send at (with zone).")
    ] = None,
    expires_in: Annotated[
        str | None,
        typer.Option(help="Don't send after this long from now (e.g. 30m, 2h, 1d)."),
    ] = None,
    priority: Annotated[
        str, typer.Option(help="high, normal or low: higher is claimed first.")
    ] = "normal",
    unsubscribe_url: Annotated[
        str | None, typer.Option(help="https:// one-click List-Unsubscribe URL.")
    ] = None,
    unsubscribe_mailto: Annotated[
        str | None, typer.Option(help="Address for a mailto: List-Unsubscribe.")
    ] = None,
) -> None:
    """Put one email into the outbox and print its id."""
    from mailbag import templates
    from mailbag.cli.maintenance import parse_age
    from mailbag.clock import utcnow
    from mailbag.compose import check_renders
    from mailbag.domain.message import InvalidMessage, new_message
    from mailbag.services import outbox as outbox_service

    config = settings()
    try:
        template_data = json.loads(data)
    except json.JSONDecodeError as exc:
        fail(f"--data is not valid JSON: {exc}")
    headers: dict[str, str] = {}
    for item in header or []:
        name, sep, value = item.partition(":")
        if not sep:
            fail(f"--header {item!r} must look like 'Name: value'")
        headers[name.strip()] = value.strip()
    when = None
    if send_at is not None:
        try:
            when = datetime.fromisoformat(send_at)
        except ValueError:
            fail(f"--send-at {send_at!r} is not an ISO 8601 time")
    expires_at = None
    if expires_in is not None:
        expires_at = utcnow() + parse_age(expires_in)
    files = [attachment(spec, config.max_attachment_bytes) for spec in attach or []]
    try:
        catalog = templates.load(config.templates_dir)
        message = new_message(
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
            html=read_text("--html", html) if html is not None else None,
            text=read_text("--text", text) if text is not None else None,
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
            known_templates=catalog.names(),
            address_rules=config.address_rules,
            limits=config.limits,
        )
        check_renders(message, catalog)
    except (InvalidMessage, templates.TemplateError) as exc:
        fail(f"invalid message: {exc}")
    try:
        with database().begin() as conn:
            (result,) = outbox_service.enqueue_many(
                conn, [message], max_attempts=config.max_attempts, actor="cli"
            )
    except InvalidMessage as exc:  # a `from` that is not the tenant's: nothing was written
        fail(f"invalid message: {exc}")
    if not result.created:
        typer.echo(f"(key {key!r} already enqueued: {result.message.status})", err=True)
    typer.echo(str(result.message.id))


def read_text(option: str, path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"{option} {path}: {exc.strerror or exc}")
    except UnicodeDecodeError:
        fail(f"{option} {path} is not UTF-8 text")


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


def top(interval: Annotated[float, typer.Option(help="Seconds between updates.")] = 2.0) -> None:
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
    message_id: Annotated[str | None, typer.Argument(help="The message to send again.")] = None,
    state: Annotated[
        str | None, typer.Option(help="Requeue every message in this state (unknown or dead).")
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


def cancel(message_id: Annotated[str, typer.Argument(help="A pending message.")]) -> None:
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
    message_id: Annotated[str, typer.Argument(help="An unknown message.")],
    evidence: Annotated[str, typer.Option(help="What shows the outcome (required).")],
    sent: Annotated[
        bool, typer.Option("--sent/--failed", help="Was it accepted by the provider?")
    ] = True,
    provider_message_id: Annotated[str | None, typer.Option(help="The provider's id.")] = None,
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
    from mailbag import providers
    from mailbag.clock import utcnow
    from mailbag.services.reconciliation import Reconciler

    config = settings()

    async def once(ops: Operations) -> Mapping[str, int]:
        provider = providers.create(config.provider, config)
        try:
            reconciler = Reconciler(
                ops.engine,
                provider=provider,
                flag_after=timedelta(minutes=config.reconcile_flag_after_minutes),
            )
            return await reconciler.run_once(utcnow(), message_domain=config.message_id_host)
        finally:
            await provider.aclose()

    typer.echo(json.dumps(dict(operations(once))))


suppressions = typer.Typer(
    help="The suppression list.", no_args_is_help=True, rich_markup_mode=None
)


@suppressions.command("list")
def suppressions_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
) -> None:
    found = operations(lambda ops: ops.suppressions(tenant_id=tenant, limit=1000))
    for item in found:
        typer.echo(f"{item.tenant_id}\t{item.email}\t{item.reason}\t{item.created_at:%Y-%m-%d}")


@suppressions.command("add")
def suppressions_add(tenant: str, email: str) -> None:
    """Never send to this address for this tenant."""
    from mailbag.clock import utcnow

    try:
        added = operations(lambda ops: ops.suppress(tenant_id=tenant, email=email, now=utcnow()))
    except ValueError as exc:
        fail(f"invalid address: {exc}")
    typer.echo("suppressed" if added else "already suppressed")


@suppressions.command("remove")
def suppressions_remove(tenant: str, email: str) -> None:
    if not operations(lambda ops: ops.unsuppress(tenant_id=tenant, email=email)):
        fail(f"{email} is not suppressed for {tenant}", code=1)
    typer.echo("removed")
