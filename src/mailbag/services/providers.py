"""What the fleet knows of each configured provider (its breaker, an operator's pause), in
words, for `mailbag providers` and whoever else shows it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mailbag.domain.breaker import Breaker
from mailbag.domain.routing import Match
from mailbag.store import fleet_state
from mailbag.store.fleet_state import FleetState, Scope
from mailbag.store.session import AsyncDatabase

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy.ext.asyncio import AsyncEngine


@dataclass(frozen=True)
class ProviderState:
    name: str
    kind: str
    state: str  # ok, paused, breaker open until ..., breaker open, probing
    failures_in_row: int
    open_until: str | None
    last_error: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def read(engine: AsyncEngine) -> FleetState:
    async with AsyncDatabase(engine).connect() as tx:
        return await tx.run(fleet_state.read())


def states(
    kinds: dict[str, str], state: FleetState, breaker: Breaker, now: datetime
) -> list[ProviderState]:
    """Each provider (name: kind) as the fleet sees it now."""
    found = []
    for name, kind in kinds.items():
        health = state.health.get(name)
        failures = health.failures_in_row if health is not None else 0
        until = health.open_until if health is not None else None
        if state.paused(Scope.PROVIDER, name):
            words = "paused"
        elif breaker.is_open(failures) and until is not None and until > now:
            words = f"breaker open until {until.isoformat(timespec='seconds')}"
        elif breaker.is_open(failures):
            words = "breaker open, probing"
        elif failures:
            words = f"ok, {failures} sure failure(s) in a row"
        else:
            words = "ok"
        last_error = health.last_error if health is not None else None
        shown_until = until.isoformat() if until is not None else None
        found.append(ProviderState(name, kind, words, failures, shown_until, last_error))
    return found


def match_words(match: Match) -> str:
    """A route's match as `tenant=acme tags=billing`; empty for the default."""
    parts = []
    if match.tenant is not None:
        parts.append(f"tenant={match.tenant}")
    if match.tags:
        parts.append("tags=" + ",".join(sorted(match.tags)))
    if match.recipient_domain is not None:
        parts.append(f"recipient_domain={match.recipient_domain}")
    return " ".join(parts)
