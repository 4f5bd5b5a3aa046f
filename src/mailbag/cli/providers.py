"""`mailbag providers`: the providers this deployment sends through, what the fleet knows
of each (its breaker, an operator's pause) and the routes that choose among them."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from mailbag.cli.invocation import fail, on_async_engine, settings


def providers(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """The configured providers, their breakers and pauses, and the routes."""
    from mailbag.clock import utcnow
    from mailbag.services import providers as fleet_view
    from mailbag.settings import InvalidSettings
    from mailbag.worker import fleet

    config = settings()
    try:
        tables = fleet.tables(config)
    except InvalidSettings as exc:
        fail(f"invalid settings: {exc}")
    kinds = {name: kind for name, (kind, _) in tables.items()} or {config.provider: config.provider}
    state = on_async_engine(fleet_view.read)
    rows = fleet_view.states(kinds, state, config.provider_breaker, utcnow())
    routing = config.routing
    routes = [
        {"match": fleet_view.match_words(route.match), "providers": list(route.providers)}
        for route in (*routing.routes, routing.default)
    ]
    if as_json:
        typer.echo(json.dumps({"providers": [r.as_dict() for r in rows], "routes": routes}))
        return
    for row in rows:
        error = f"  ({row.last_error})" if row.last_error else ""
        typer.echo(f"{row.name}\t{row.kind}\t{row.state}{error}")
    typer.echo("routes (the first that fits a message):")
    for number, route in enumerate(routes, start=1):
        chosen = ", ".join(route["providers"])
        typer.echo(f"  {number}. {route['match'] or 'any message'} -> {chosen}")
