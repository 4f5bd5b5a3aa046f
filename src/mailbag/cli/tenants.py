"""`mailbag tenants`: tenants and their API keys."""

from __future__ import annotations

from typing import Annotated

import typer

from mailbag.cli.invocation import database, fail

tenants = typer.Typer(
    help="Tenants and their API keys.", no_args_is_help=True, rich_markup_mode=None
)


@tenants.command("create")
def create(name: Annotated[str, typer.Argument(help="A unique name.")]) -> None:
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


@tenants.command("list")
def list_() -> None:
    """List tenants (ids, names, key prefixes; never keys)."""
    from mailbag.services import tenants as tenant_service

    for tenant in tenant_service.all_tenants(database()):
        typer.echo(f"{tenant.id}\t{tenant.name}\t{tenant.api_key_prefix}...")
