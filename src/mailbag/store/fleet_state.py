"""What every worker of the fleet shares about where mail may go: each provider's breaker
(`provider_health`) and what operators paused (`pauses`).

A worker reads both at most once a poll interval (`read`) and writes what its sends taught
it (`record`): a provider that answered closes its breaker; one that surely failed (could
not be reached, erred about itself, is disabled) adds to its failures in a row, and after
enough of them (domain.breaker) messages wait for it instead of going to it, no attempt
spent, until its open_until; then one at a time probes it. A provider's row exists from its
first failure; a healthy provider that never failed has none, and costs no write.

Pauses are an operator's (`mailbag pause|resume`, the admin API, the console): the whole
fleet (scope `fleet`, target ''), one provider, or one tenant. Paused mail waits, no
attempt spent.

On PostgreSQL every change of what `read` reads (a pause, a resume, a breaker's count, a
tenant's account) is announced (`announce`: a NOTIFY on the outbox's channel, delivered at
commit), so a worker whose LISTEN is known to work reads again when told instead of every
poll interval (worker/fleet.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from sqlalchemy import delete, func, select, update

from mailbag.domain.breaker import Breaker
from mailbag.domain.message import truncate_error
from mailbag.store.enqueue import NOTIFY_CHANNEL
from mailbag.store.plan import Plan, Step, current_dialect, together
from mailbag.store.schema import pauses as pa
from mailbag.store.schema import provider_health as ph
from mailbag.store.types import insert_into


class Scope(StrEnum):
    FLEET = "fleet"
    PROVIDER = "provider"
    TENANT = "tenant"


@dataclass(frozen=True)
class Health:
    failures_in_row: int = 0
    open_until: datetime | None = None
    last_error: str | None = None


@dataclass(frozen=True)
class Pause:
    scope: Scope
    target: str
    paused_at: datetime
    paused_by: str
    reason: str | None


@dataclass(frozen=True)
class FleetState:
    health: Mapping[str, Health] = field(default_factory=dict)
    pauses: tuple[Pause, ...] = ()

    def paused(self, scope: Scope, target: str = "") -> bool:
        return any(p.scope is scope and p.target == target for p in self.pauses)

    def paused_targets(self, scope: Scope) -> frozenset[str]:
        return frozenset(p.target for p in self.pauses if p.scope is scope)


CHANGED = "mailbag-fleet-state"  # the payload of `announce`'s NOTIFY
_ANNOUNCE = select(func.pg_notify(NOTIFY_CHANNEL, CHANGED))


def announce() -> Plan[None]:
    """Tell the fleet's workers its state changed (PostgreSQL; elsewhere they poll)."""
    if (yield from current_dialect()) == "postgresql":
        yield Step(_ANNOUNCE)


# Built once: a worker reads both every poll interval, and a statement made afresh is
# compiled-cache keyed afresh each time.
_BREAKERS = select(ph)
_PAUSES = select(pa).order_by(pa.c.paused_at)


def read(*, last: bool = True) -> Plan[FleetState]:
    """Every provider's breaker and every pause: two small tables, read in one round trip
    where the runner can (`last`: nothing follows in the plan)."""
    breakers, paused_rows = yield from together(Step(_BREAKERS), Step(_PAUSES), last=last)
    health = {
        row.name: Health(row.failures_in_row, row.open_until, row.last_error)
        for row in breakers.all()
    }
    found = paused_rows.all()
    known = {scope.value for scope in Scope}  # a scope of a newer version: not ours to obey
    paused = tuple(
        Pause(Scope(row.scope), row.target, row.paused_at, row.paused_by, row.reason)
        for row in found
        if row.scope in known
    )
    return FleetState(health, paused)


def record(
    *,
    answered: set[str],
    failed: Mapping[str, tuple[int, str]],
    now: datetime,
    breaker: Breaker,
) -> Plan[dict[str, datetime]]:
    """Providers that answered close their breaker (a write only where one had failed);
    each of `failed` (name: failures, last error) adds to its failures in a row and opens
    once the breaker says so. Returns the providers it opened (or kept open), until when."""
    if answered:
        yield Step(
            update(ph)
            .where(ph.c.name.in_(sorted(answered)), ph.c.failures_in_row != 0)
            .values(failures_in_row=0, open_until=None, last_error=None, updated_at=now)
        )
    opened: dict[str, datetime] = {}
    dialect = yield from current_dialect()
    for name, (count, error) in sorted(failed.items()):
        if name in answered:
            continue  # it answered others meanwhile: not failing in a row
        insert = insert_into(dialect, ph).values(
            name=name, failures_in_row=0, updated_at=now, last_error=None
        )
        if dialect == "mysql":
            yield Step(insert.on_duplicate_key_update(name=ph.c.name))
        else:
            yield Step(insert.on_conflict_do_nothing(index_elements=[ph.c.name]))
        before = (yield Step(select(ph.c.failures_in_row).where(ph.c.name == name))).scalar_one()
        # It opens for the first wait however many sends were in flight when it did; once
        # open, what fails is one probe at a time, each doubling the wait once.
        opening = min(before + count, breaker.failures)
        failures = before + 1 if breaker.is_open(before) else opening
        pause = breaker.pause(failures)
        values = {
            "failures_in_row": failures,
            "last_error": truncate_error(error),
            "updated_at": now,
        }
        if pause is not None:
            opened[name] = values["open_until"] = now + pause
        yield Step(update(ph).where(ph.c.name == name).values(values))
    yield from announce()
    return opened


def pause(
    scope: Scope, target: str, *, now: datetime, actor: str, reason: str | None
) -> Plan[bool]:
    """Pause `target` (False: it was paused already, and stays as it was)."""
    key = (pa.c.scope == scope.value, pa.c.target == target)
    if (yield Step(select(pa.c.scope).where(*key))).first() is not None:
        return False
    dialect = yield from current_dialect()
    insert = insert_into(dialect, pa).values(
        scope=scope.value, target=target, paused_at=now, paused_by=actor[:200], reason=reason
    )
    # Two operators at once: the second's insert leaves the first's pause as it is (the
    # drivers' row counts say nothing reliable here, so the read above answers).
    if dialect == "mysql":
        yield Step(insert.on_duplicate_key_update(scope=pa.c.scope))
    else:
        yield Step(insert.on_conflict_do_nothing(index_elements=[pa.c.scope, pa.c.target]))
    yield from announce()
    return True


def resume(scope: Scope, target: str) -> Plan[bool]:
    """Resume `target` (False: it was not paused)."""
    result = yield Step(delete(pa).where(pa.c.scope == scope.value, pa.c.target == target))
    if not result.rowcount:  # type: ignore[attr-defined]
        return False
    yield from announce()
    return True
