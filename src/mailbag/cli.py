"""The `mailbag` command: parse arguments, call a service, print the answer.

Bad input exits with status 2 and a message on stderr, having written nothing; a database
whose schema is missing or stale exits with status 1 and says to run `mailbag migrate`
(only `migrate` and `serve` change the schema).

Each command imports what it needs when it runs: `mailbag --help` or `mailbag stats` must
not pay for FastAPI, uvicorn or botocore (tests/test_first_run.py keeps it so).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rich.table import Table
    from sqlalchemy import Engine

    from mailbag.services.operations import Health, Operations
    from mailbag.settings import Settings

T = TypeVar("T")
CLI_ACTOR = "operator:cli"

app = typer.Typer(
    name="mailbag",
    help="Transactional email through an outbox: enqueue in your transaction, sent exactly once.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: formatting it with rich costs ~0.1 s a start
)


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"mailbag: {message}", err=True)
    raise typer.Exit(code)


def load_settings(**overrides: Any) -> Settings:
    from mailbag.settings import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except Exception as exc:  # pydantic's ValidationError or a bad URL: say it, don't trace
        fail(f"invalid settings: {exc}")


def prepare(settings: Settings, *, upgrade: bool = False, key: bool = False) -> None:
    """Check what a command needs before it starts: the schema (migrated first with
    `upgrade`) and, for the long-running commands, the deployment key: present, and the
    one this database was first used with."""
    from mailbag import runtime

    try:
        if key:
            runtime.require_key(settings)
        runtime.ensure_schema(settings, upgrade=upgrade)
        if key:
            runtime.check_key(settings)
    except runtime.CannotStart as exc:
        fail(str(exc), code=1)


def current_engine(settings: Settings) -> Engine:
    """An engine on a database whose schema is current (commands never migrate implicitly:
    replicas and scripts running side by side must not race to change the schema)."""
    from mailbag.store.database import make_engine

    prepare(settings)
    return make_engine(settings.database_url)


def parse_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        fail(f"{value!r} is not a message id (a UUID)")


@app.command()
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

    settings = load_settings()
    prepare(settings, upgrade=True)
    typer.echo(f"schema at revision {migrations.HEAD}")
    if accept_new_key:
        try:
            runtime.require_key(settings)
            runtime.accept_new_key(settings)
        except runtime.CannotStart as exc:
            fail(str(exc), code=1)
        typer.echo(
            "mailbag: warning: the database now expects the current secret key; verification "
            "codes not yet confirmed and console sessions made with the old key no longer "
            "work. Give every API and worker replica this key.",
            err=True,
        )


@app.command()
def enqueue(
    to: Annotated[str, typer.Option(help="Recipient address.")],
    template: Annotated[str, typer.Option(help="Template name, e.g. welcome.")],
    data: Annotated[str, typer.Option(help="Template data as a JSON object.")] = "{}",
    key: Annotated[
        str | None, typer.Option(help="Idempotency key: the same key, the same message.")
    ] = None,
    subject: Annotated[str | None, typer.Option(help="Overrides the template's subject.")] = None,
    to_name: Annotated[str | None, typer.Option(help="Recipient display name.")] = None,
    sender: Annotated[
        str | None, typer.Option("--from", help="Sender address (default FROM_EMAIL).")
    ] = None,
    tenant: Annotated[str, typer.Option(help="Tenant the message belongs to.")] = "default",
    header: Annotated[
        list[str] | None, typer.Option(help="Extra header 'Name: value' (repeatable).")
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Tag (repeatable).")] = None,
    send_at: Annotated[
        str | None, typer.Option(help="ISO 8601 time to send at (with zone).")
    ] = None,
) -> None:
    """Put one email into the outbox and print its id."""
    from mailbag import templates
    from mailbag.compose import check_renders
    from mailbag.domain.message import InvalidMessage, new_message
    from mailbag.services import outbox as outbox_service

    settings = load_settings()
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
    try:
        catalog = templates.load(settings.templates_dir)
        message = new_message(
            to=to,
            template=template,
            data=template_data,
            idempotency_key=key,
            subject=subject,
            to_name=to_name,
            from_address=sender,
            tenant_id=tenant,
            headers=headers,
            tags=tag or [],
            send_at=when,
            known_templates=catalog.names(),
            address_rules=settings.address_rules,
        )
        check_renders(message, catalog)
    except (InvalidMessage, templates.TemplateError) as exc:
        fail(f"invalid message: {exc}")
    engine = current_engine(settings)
    with engine.begin() as conn:
        (result,) = outbox_service.enqueue_many(
            conn, [message], max_attempts=settings.max_attempts, actor="cli"
        )
    if not result.created:
        typer.echo(f"(key {key!r} already enqueued: {result.message.status})", err=True)
    typer.echo(str(result.message.id))


def with_operations(settings: Settings, action: Callable[[Operations], Awaitable[T]]) -> T:
    """Run one operator action (the same code the console and admin API run)."""
    import asyncio

    from mailbag.services.operations import Operations
    from mailbag.store.database import dialect_of, make_async_engine

    prepare(settings)

    async def main() -> T:
        engine = make_async_engine(settings.database_url, null_pool=True)
        try:
            operations = Operations(
                engine, dialect_of(settings.database_url), default_attempts=settings.max_attempts
            )
            return await action(operations)
        finally:
            await engine.dispose()

    return asyncio.run(main())


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


@app.command()
def stats(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Counts by state, the oldest due message's age, sends and errors in the last hour."""
    from mailbag.clock import utcnow

    settings = load_settings()
    health = with_operations(settings, lambda ops: ops.health(utcnow()))
    if as_json:
        typer.echo(json.dumps(health.as_dict()))
    else:
        from rich.console import Console  # only for the table: scripts read --json

        Console().print(health_table(health))


@app.command()
def top(interval: Annotated[float, typer.Option(help="Seconds between updates.")] = 2.0) -> None:
    """`stats`, live, until Ctrl-C."""
    import asyncio
    import contextlib

    from rich.live import Live

    from mailbag.clock import utcnow

    settings = load_settings()

    async def watch(ops: Operations) -> None:
        with Live(health_table(await ops.health(utcnow())), refresh_per_second=4) as live:
            while True:
                await asyncio.sleep(interval)
                live.update(health_table(await ops.health(utcnow())))

    with contextlib.suppress(KeyboardInterrupt):
        with_operations(settings, watch)


@app.command()
def requeue(
    message_id: Annotated[str | None, typer.Argument(help="The message to send again.")] = None,
    state: Annotated[
        str | None, typer.Option(help="Requeue every message in this state (unknown or dead).")
    ] = None,
) -> None:
    """Send unknown or dead messages again (an operator's decision, never automatic)."""
    from mailbag.clock import utcnow
    from mailbag.domain import states
    from mailbag.domain.states import Status
    from mailbag.services.operations import Filter

    settings = load_settings()
    allowed = {s.value for s in states.sources(states.Action.REQUEUE)}
    if (message_id is None) == (state is None):
        fail("give a message id or --state, not both")
    if state is not None and state not in allowed:
        fail(f"--state must be one of {sorted(allowed)}")
    ids = [parse_id(message_id)] if message_id is not None else None
    where = Filter(status=Status(state)) if state is not None else None
    changed = with_operations(
        settings,
        lambda ops: ops.requeue(message_ids=ids, where=where, now=utcnow(), actor=CLI_ACTOR),
    )
    if message_id is not None and not changed:
        fail(f"message {message_id} is not unknown or dead (or does not exist)", code=1)
    typer.echo(f"requeued {len(changed)} message(s)")


@app.command()
def cancel(message_id: Annotated[str, typer.Argument(help="A pending message.")]) -> None:
    """Withdraw a pending message before any attempt."""
    from mailbag.clock import utcnow
    from mailbag.services.operations import NotAllowed

    settings = load_settings()
    target = parse_id(message_id)
    try:
        with_operations(
            settings, lambda ops: ops.cancel(message_id=target, now=utcnow(), actor=CLI_ACTOR)
        )
    except NotAllowed:
        fail(f"message {message_id} is not pending (or does not exist)", code=1)
    typer.echo(f"cancelled {message_id}")


@app.command()
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

    settings = load_settings()
    target = parse_id(message_id)
    if not evidence.strip():
        fail("--evidence must say what shows the outcome")
    try:
        with_operations(
            settings,
            lambda ops: ops.resolve(
                message_id=target,
                sent=sent,
                evidence=evidence,
                now=utcnow(),
                actor=CLI_ACTOR,
                provider_message_id=provider_message_id,
            ),
        )
    except NotAllowed:
        fail(f"message {message_id} is not unknown (or does not exist)", code=1)
    typer.echo(f"{message_id} is now {'sent' if sent else 'failed'}")


@app.command()
def reconcile() -> None:
    """Look for evidence about every unknown message now (workers do this regularly)."""
    from mailbag import providers
    from mailbag.clock import utcnow
    from mailbag.services.reconciliation import Reconciler

    settings = load_settings()

    async def once(ops: Operations) -> Mapping[str, int]:
        provider = providers.create(settings.provider, settings)
        try:
            reconciler = Reconciler(
                ops.engine,
                ops.dialect,
                provider=provider,
                flag_after=timedelta(minutes=settings.reconcile_flag_after_minutes),
            )
            return await reconciler.run_once(utcnow(), message_domain=settings.message_id_host)
        finally:
            await provider.aclose()

    outcomes = with_operations(settings, once)
    typer.echo(json.dumps(dict(outcomes)))


suppressions_app = typer.Typer(
    help="The suppression list.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(suppressions_app, name="suppressions")


@suppressions_app.command("list")
def suppressions_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
) -> None:
    settings = load_settings()
    found = with_operations(settings, lambda ops: ops.suppressions(tenant_id=tenant, limit=1000))
    for item in found:
        typer.echo(f"{item.tenant_id}\t{item.email}\t{item.reason}\t{item.created_at:%Y-%m-%d}")


@suppressions_app.command("add")
def suppressions_add(tenant: str, email: str) -> None:
    """Never send to this address for this tenant."""
    from mailbag.clock import utcnow

    settings = load_settings()
    try:
        added = with_operations(
            settings, lambda ops: ops.suppress(tenant_id=tenant, email=email, now=utcnow())
        )
    except ValueError as exc:
        fail(f"invalid address: {exc}")
    typer.echo("suppressed" if added else "already suppressed")


@suppressions_app.command("remove")
def suppressions_remove(tenant: str, email: str) -> None:
    settings = load_settings()
    if not with_operations(settings, lambda ops: ops.unsuppress(tenant_id=tenant, email=email)):
        fail(f"{email} is not suppressed for {tenant}", code=1)
    typer.echo("removed")


def parse_age(value: str) -> timedelta:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = value[:-1], value[-1:]
    if unit not in units or not number.isdigit():
        fail(f"{value!r} is not an age like 30d, 12h or 90m")
    return timedelta(seconds=int(number) * units[unit])


@app.command()
def purge(
    older_than: Annotated[str, typer.Option(help="Age like 30d, 12h or 90m.")] = "30d",
) -> None:
    """Delete finished messages (sent, failed, dead, cancelled) last changed before the cutoff."""
    from mailbag.clock import utcnow
    from mailbag.store import idempotency as idempotency_store
    from mailbag.store import outbox as store
    from mailbag.store.database import dialect_of
    from mailbag.store.plan import run

    settings = load_settings()
    cutoff = utcnow() - parse_age(older_than)
    engine = current_engine(settings)
    dialect = dialect_of(settings.database_url)
    total = records = 0
    while True:
        with engine.begin() as conn:
            deleted = run(conn, store.purge(dialect, older_than=cutoff))
        total += deleted
        if deleted < 1000:
            break
    while True:  # expired idempotency records, whatever --older-than says
        with engine.begin() as conn:
            dropped = run(conn, idempotency_store.purge_expired(utcnow()))
        records += dropped
        if dropped < 1000:
            break
    typer.echo(f"purged {total} message(s) and {records} expired idempotency record(s)")


@app.command()
def worker(
    concurrency: Annotated[int | None, typer.Option(help="Sends in flight at once.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Messages claimed per round.")] = None,
    worker_id: Annotated[
        str | None, typer.Option("--id", help="Worker id (default host:pid).")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port.")
    ] = None,
) -> None:
    """Send email from the outbox until SIGTERM/SIGINT, then drain and exit 0."""
    settings = load_settings(
        concurrency=concurrency,
        batch_size=batch_size,
        worker_id=worker_id,
        metrics_port=metrics_port,
    )
    import asyncio

    from mailbag import log, runtime
    from mailbag.worker import WorkerFailed

    log.configure(settings.log_level)
    check_provider(settings)
    prepare(settings, key=True)
    try:
        asyncio.run(runtime.run_worker(settings))
    except WorkerFailed as exc:  # logged with its traceback by the worker
        fail(str(exc), code=1)


@app.command()
def serve() -> None:
    """Everything in one process: migrate, then run the API and the worker.

    Exits non-zero at once, saying why, if any part cannot start (or later stops on its own).
    """
    import asyncio

    from mailbag import log, runtime

    settings = load_settings()
    log.configure(settings.log_level)
    check_provider(settings)
    prepare(settings, upgrade=True, key=True)

    def ready() -> None:  # only once the API listens
        typer.echo(
            f"mailbag: API on http://{settings.api_host}:{settings.api_port} (docs at /docs)",
            err=True,
        )
        if settings.provider == "file":
            typer.echo(f"mailbag: emails are written to {settings.file_dir.resolve()}", err=True)

    try:
        asyncio.run(runtime.run_serve(settings, on_ready=ready))
    except runtime.ServeFailed as exc:
        fail(str(exc), code=1)


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on.")] = None,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes.")] = 1,
) -> None:
    """Serve the HTTP API (and the console) with uvicorn."""
    import uvicorn

    from mailbag import log, runtime

    settings = load_settings(api_host=host, api_port=port)
    log.configure(settings.log_level)
    prepare(settings, key=True)

    # Worker processes read their settings from the environment, so pass overrides there.
    os.environ["MAILBAG_API_HOST"], os.environ["MAILBAG_API_PORT"] = (
        settings.api_host,
        str(settings.api_port),
    )
    uvicorn.run(**runtime.uvicorn_options(settings, workers=workers))


tenants_app = typer.Typer(
    help="Tenants and their API keys.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(tenants_app, name="tenants")


@tenants_app.command("create")
def tenants_create(name: Annotated[str, typer.Argument(help="A unique name.")]) -> None:
    """Create a tenant and print its API key (shown this once; only a digest is kept)."""
    from mailbag.services import tenants as tenant_service
    from mailbag.store import tenants as tenant_store
    from mailbag.store.plan import run

    if not name.strip() or len(name) > 200:
        fail("the name must be 1 to 200 characters")
    settings = load_settings()
    engine = current_engine(settings)
    with engine.begin() as conn:
        if run(conn, tenant_store.by_name(name)) is not None:
            fail(f"a tenant named {name!r} exists already", code=1)
        tenant, key = tenant_service.create_tenant(conn, name)
    typer.echo(f"tenant {tenant.id} ({tenant.name})", err=True)
    typer.echo(key)


@tenants_app.command("list")
def tenants_list() -> None:
    """List tenants (ids, names, key prefixes; never keys)."""
    from mailbag.store import tenants as tenant_store
    from mailbag.store.plan import run

    settings = load_settings()
    engine = current_engine(settings)
    with engine.connect() as conn:
        for tenant in run(conn, tenant_store.all_tenants()):
            typer.echo(f"{tenant.id}\t{tenant.name}\t{tenant.api_key_prefix}...")


def check_provider(settings: Settings) -> None:
    from mailbag import providers

    if settings.provider not in providers.available():
        fail(
            f"unknown provider {settings.provider!r}; available: {', '.join(providers.available())}"
        )
