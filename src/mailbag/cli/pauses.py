"""`mailbag pause`, `resume` and `pauses`: hold sending back, fleet-wide, for one provider
or for one tenant, and let it go again (the service the admin API and the console use).

Every worker sees a pause or a resume within a poll interval; paused mail waits, no
attempt spent. Exits, as every command: 2 for bad input (both --provider and --tenant, a
malformed provider name, an unknown tenant), 1 for a resume of what is not paused. A pause
of what is paused already exits 0 and says since when and by whom.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from mailbag.cli.invocation import ACTOR, fail, on_async_engine

if TYPE_CHECKING:
    from mailbag.services.pauses import Pauses

T = TypeVar("T")

PROVIDER = Annotated[
    str | None, typer.Option(metavar="NAME", help="Only this provider (e.g. brevo).")
]
TENANT = Annotated[
    str | None, typer.Option(metavar="TENANT", help="Only this tenant (its id or name).")
]


def _service(action: Callable[[Pauses], Awaitable[T]], target: str = "target") -> T:
    """One call of the pauses service; its refusals become messages and exits, naming the
    option that carried what was refused (`target`: --provider or --tenant)."""
    from mailbag.services import pauses as pause_service

    try:
        return on_async_engine(lambda engine: action(pause_service.Pauses(engine)))
    except pause_service.InvalidPause as exc:
        option = {"target": target}
        fail("; ".join(f"--{option.get(k, k)} {why}" for k, why in exc.errors.items()))
    except pause_service.NotPaused as exc:
        fail(str(exc), code=1)


def _utc(at: datetime) -> str:
    return at.isoformat(timespec="seconds").replace("+00:00", "Z")


def pause(
    provider: PROVIDER = None,
    tenant: TENANT = None,
    reason: Annotated[
        str | None, typer.Option(metavar="TEXT", help="Why, for the other operators.")
    ] = None,
) -> None:
    """Pause sending: the whole fleet, or only --provider's or --tenant's mail."""
    from mailbag.clock import utcnow
    from mailbag.services.pauses import InvalidPause, scope_of, what

    try:
        scope, target = scope_of(provider=provider, tenant=tenant)
    except InvalidPause:
        fail("give --provider or --tenant (or neither, for the whole fleet), not both")
    done = _service(
        lambda svc: svc.pause(scope, target, now=utcnow(), actor=ACTOR, reason=reason),
        scope.value,
    )
    p = done.pause
    if done.new:
        typer.echo(f"paused {what(p.scope, p.target)}: its mail waits until it is resumed")
    else:
        why = f" ({p.reason})" if p.reason else ""
        typer.echo(
            f"{what(p.scope, p.target)} is already paused since {_utc(p.paused_at)} "
            f"by {p.paused_by}{why}"
        )


def resume(provider: PROVIDER = None, tenant: TENANT = None) -> None:
    """Resume sending what `mailbag pause` paused (the same options)."""
    from mailbag.services.pauses import InvalidPause, scope_of, what

    try:
        scope, target = scope_of(provider=provider, tenant=tenant)
    except InvalidPause:
        fail("give --provider or --tenant (or neither, for the whole fleet), not both")
    lifted = _service(lambda svc: svc.resume(scope, target), scope.value)
    typer.echo(
        f"resumed {what(lifted.scope, lifted.target)} (paused since {_utc(lifted.paused_at)} "
        f"by {lifted.paused_by})"
    )


def pauses() -> None:
    """What is paused: scope, target, since (UTC), by whom, reason, age in seconds."""
    from mailbag.clock import utcnow
    from mailbag.services.pauses import age_seconds

    found = _service(lambda svc: svc.listing())
    if not found:
        typer.echo("nothing is paused", err=True)
    now = utcnow()
    for p in found:
        age = f"{age_seconds(p, now):.0f} s"
        typer.echo(
            "\t".join(
                (
                    p.scope.value,
                    p.target or "-",
                    _utc(p.paused_at),
                    p.paused_by,
                    p.reason or "",
                    age,
                )
            )
        )
