"""`mailbag tenants`: tenants and their API keys."""

from __future__ import annotations

from typing import Annotated

import typer

from mailbag.cli.help import Command, group
from mailbag.cli.invocation import database, fail, on_async_engine
from mailbag.cli.tenant_accounts import account

tenants = group("Tenants and their API keys.")


@tenants.command("create", cls=Command)
def create(name: Annotated[str, typer.Argument(metavar="NAME", help="A unique name.")]) -> None:
    """Create a tenant and print its API key (shown this once; only a digest is kept)."""
    from mailbag.services import tenants as tenant_service

    if not name.strip() or len(name) > 200:
        fail("the name must be 1 to 200 characters")
    try:
        tenant, key = tenant_service.create_tenant(database(), name)
    except tenant_service.NameTaken as exc:
        fail(str(exc), code=1)
    typer.echo(f"tenant {tenant.id} ({tenant.name})", err=True)
    typer.echo(key)


@tenants.command("list", cls=Command)
def list_() -> None:
    """List tenants (ids, names, key prefixes; never keys)."""
    from mailbag.services import tenants as tenant_service

    for tenant in tenant_service.all_tenants(database()):
        typer.echo(f"{tenant.id}\t{tenant.name}\t{tenant.api_key_prefix}...")


senders = group("The addresses a tenant may send from (a message's `from`), besides FROM_EMAIL.")
tenants.add_typer(senders, name="senders")
tenants.add_typer(account, name="account")

TENANT = Annotated[str, typer.Argument(metavar="TENANT", help="Tenant id or name (or `default`).")]


@senders.command("add", cls=Command)
def senders_add(
    tenant: TENANT,
    address: Annotated[str, typer.Argument(metavar="ADDRESS", help="The From address.")],
    name: Annotated[str | None, typer.Option(metavar="NAME", help="Its display name.")] = None,
) -> None:
    """Let a tenant send from an address."""
    from mailbag.domain.message import InvalidMessage
    from mailbag.services import tenants as tenant_service

    try:
        tenant_id, added = tenant_service.add_sender(database(), tenant, address, name)
    except InvalidMessage as exc:
        fail(f"invalid sender identity: {exc}")
    except tenant_service.UnknownTenant as exc:
        fail(str(exc))
    typer.echo(f"{tenant_id} may send from {address}" + ("" if added else " (already could)"))


@senders.command("list", cls=Command)
def senders_list(tenant: TENANT) -> None:
    """A tenant's sender identities: address, name, when added."""
    from mailbag.services import tenants as tenant_service

    try:
        found = tenant_service.senders(database(), tenant)
    except tenant_service.UnknownTenant as exc:
        fail(str(exc))
    for sender in found:
        typer.echo(f"{sender.address}\t{sender.name or ''}\t{sender.created_at:%Y-%m-%d}")


@senders.command("remove", cls=Command)
def senders_remove(
    tenant: TENANT,
    address: Annotated[str, typer.Argument(metavar="ADDRESS", help="The From address.")],
) -> None:
    """Stop a tenant sending from an address (messages already enqueued keep it)."""
    from mailbag.services import tenants as tenant_service

    try:
        removed = tenant_service.remove_sender(database(), tenant, address)
    except tenant_service.UnknownTenant as exc:
        fail(str(exc))
    if not removed:
        fail(f"{address} is not a sender identity of {tenant}", code=1)
    typer.echo("removed")


@tenants.command("retention", cls=Command)
def retention(
    tenant: TENANT,
    days: Annotated[
        str,
        typer.Argument(
            metavar="DAYS",
            help="Days its finished messages are kept (0: never purged), or `default` for "
            "the PURGE_AFTER_DAYS setting's.",
        ),
    ],
) -> None:
    """Set a tenant's own PURGE_AFTER_DAYS: the scheduler purges its finished messages after
    that many days instead of the setting's."""
    from mailbag.clock import utcnow
    from mailbag.services import maintenance

    if days == "default":
        value = None
    else:
        try:
            value = maintenance.checked_days(float(days))
        except (ValueError, maintenance.InvalidRetention):
            fail(f"DAYS must be a number of days from 0 to {maintenance.RETENTION_MAX_DAYS:g}")
    tenant_id = on_async_engine(
        lambda engine: maintenance.set_retention(engine, tenant, value, now=utcnow())
    )
    shown = "the PURGE_AFTER_DAYS setting's" if value is None else f"{value:g} day(s)"
    typer.echo(f"{tenant_id} keeps finished messages {shown}")
