"""Operators' pauses: the whole fleet, one provider or one tenant (River UI's and Oban
Web's queue pause are the model). The CLI (`mailbag pause|resume|pauses`), the admin API
(`/v1/admin/pauses`) and the console all come through here, so a target means the same
wherever it is named.

- `pause_target` is the one check of what may be paused: the fleet takes no target, a
  provider a well-formed name ([a-z0-9_-], 1 to 50), a tenant its id or name (resolved to
  its id: UnknownTenant otherwise). Bad input raises InvalidPause and writes nothing.
- Pausing what is paused already is no error: the answer is the pause in force, as it was
  (who paused it, when, why), with `new` false. Resuming what is not paused raises
  NotPaused (CLI exit 1, HTTP 404), as removing a suppression that is not there does.
- Workers read pauses once a poll interval (worker/fleet.py): a paused fleet claims
  nothing, a paused tenant's mail is left out of the claim, a paused provider's mail waits
  (released unsent, no attempt spent, its last_error saying so: `holding` reads that).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from mailbag.domain.message import Message, unsafe_text
from mailbag.domain.routing import paused_in
from mailbag.domain.states import CLAIMABLE
from mailbag.services.tenants import tenant_id_of
from mailbag.store import fleet_state
from mailbag.store.fleet_state import Pause, Scope
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy.ext.asyncio import AsyncEngine

PROVIDER_NAME = re.compile(r"[a-z0-9_-]{1,50}")
REASON_MAX = 500  # the column's width
SCOPES = tuple(scope.value for scope in Scope)


class InvalidPause(ValueError):
    """What to pause (or resume) is not something that can be: nothing was changed."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{name} {why}" for name, why in self.errors.items()))


class NotPaused(LookupError):
    """A resume of something that is not paused: nothing was changed."""

    def __init__(self, scope: Scope, target: str) -> None:
        self.scope, self.target = scope, target
        super().__init__(f"{what(scope, target)} is not paused")


@dataclass(frozen=True)
class Paused:
    """The pause in force after a pause: this one (`new`) or the one that was there."""

    pause: Pause
    new: bool


def what(scope: Scope, target: str) -> str:
    """A pause's target as a sentence names it: "the fleet", "provider brevo"."""
    return "the fleet" if scope is Scope.FLEET else f"{scope.value} {target}"


def parse_scope(value: str) -> Scope:
    try:
        return Scope(value)
    except ValueError:
        raise InvalidPause({"scope": f"must be one of {', '.join(SCOPES)}"}) from None


def scope_of(*, provider: str | None, tenant: str | None) -> tuple[Scope, str]:
    """The scope and target the command line's options name: neither, the fleet."""
    if provider is not None and tenant is not None:
        raise InvalidPause({"scope": "must be the fleet, a provider or a tenant, not both"})
    if provider is not None:
        return Scope.PROVIDER, provider
    if tenant is not None:
        return Scope.TENANT, tenant
    return Scope.FLEET, ""


def pause_target(scope: Scope, target: str | None) -> Plan[str]:
    """The target a pause of `scope` is stored under: '' for the fleet, a provider's name,
    a tenant's id (named by its id or name). InvalidPause or UnknownTenant otherwise."""
    target = (target or "").strip()
    if scope is Scope.FLEET:
        if target:
            raise InvalidPause({"target": "must be empty: the fleet is paused as a whole"})
        return ""
    if not target:
        raise InvalidPause({"target": f"must name the {scope.value}"})
    if scope is Scope.PROVIDER:
        # Any well-formed name for now; the configured providers' names will be checked here.
        if not PROVIDER_NAME.fullmatch(target):
            raise InvalidPause(
                {"target": "must be a provider's name: 1 to 50 of a-z, 0-9, _ and -"}
            )
        return target
    return (yield from tenant_id_of(target))


def checked_reason(reason: str | None) -> str | None:
    """An operator's note, stripped (None when empty); InvalidPause if it cannot be kept."""
    reason = (reason or "").strip()
    if len(reason) > REASON_MAX:
        raise InvalidPause({"reason": f"must be at most {REASON_MAX} characters"})
    if (problem := unsafe_text(reason, tab=False)) is not None:  # lists are tab-separated
        raise InvalidPause({"reason": problem})
    return reason or None


def _find(scope: Scope, target: str) -> Plan[Pause | None]:
    state = yield from fleet_state.read()
    return next((p for p in state.pauses if p.scope is scope and p.target == target), None)


def _pause(
    scope: Scope, target: str | None, now: datetime, actor: str, reason: str | None
) -> Plan[Paused]:
    note = checked_reason(reason)
    stored = yield from pause_target(scope, target)
    if (existing := (yield from _find(scope, stored))) is not None:
        return Paused(existing, new=False)
    # Read first, not told by the insert: fleet_state.pause's answer is False on PostgreSQL
    # and True on MariaDB whether it wrote or not. Two operators pausing one target at the
    # same moment both hear "paused"; the first one's pause is the one kept.
    yield from fleet_state.pause(scope, stored, now=now, actor=actor, reason=note)
    return Paused(Pause(scope, stored, now, actor[:200], note), new=True)


def _resume(scope: Scope, target: str | None) -> Plan[Pause]:
    stored = yield from pause_target(scope, target)
    found = yield from _find(scope, stored)
    if found is None or not (yield from fleet_state.resume(scope, stored)):
        raise NotPaused(scope, stored)
    return found


class Pauses:
    """Pause, resume and list, for every door (the command line runs it too)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.db = AsyncDatabase(engine)

    async def pause(
        self, scope: Scope, target: str | None, *, now: datetime, actor: str, reason: str | None
    ) -> Paused:
        async with self.db.transaction() as tx:
            return await tx.run(_pause(scope, target, now, actor, reason))

    async def target(self, scope: Scope, target: str | None) -> str:
        """`pause_target`, writing nothing: what a form asks about before it confirms."""
        async with self.db.connect(read_only=True) as session:
            return await session.run(pause_target(scope, target))

    async def resume(self, scope: Scope, target: str | None) -> Pause:
        """Resume `target`: the pause that was lifted (NotPaused if there was none)."""
        async with self.db.transaction() as tx:
            return await tx.run(_resume(scope, target))

    async def listing(self) -> tuple[Pause, ...]:
        """Every pause in force, oldest first."""
        async with self.db.connect(read_only=True) as session:
            return (await session.run(fleet_state.read())).pauses


def age_seconds(pause: Pause, now: datetime) -> float:
    return max(0.0, (now - pause.paused_at).total_seconds())


def oldest_by_scope(pauses: Iterable[Pause], now: datetime) -> dict[Scope, tuple[int, float]]:
    """For each scope: how many pauses are in force and how long the oldest has lasted
    (0, 0.0 with none): the gauges an alert watches (api/scrape.py)."""
    found = {scope: (0, 0.0) for scope in Scope}
    for pause in pauses:
        count, oldest = found[pause.scope]
        found[pause.scope] = (count + 1, max(oldest, age_seconds(pause, now)))
    return found


def paused_providers(last_error: str | None) -> frozenset[str]:
    """The providers a worker found paused when it last let the message wait, from its
    last_error (Fleet.why_waiting's words)."""
    return paused_in(last_error)


def holding(pauses: Sequence[Pause], message: Message) -> list[Pause]:
    """The pauses in force that hold `message` back: the fleet's, its tenant's, and those
    of the providers its last wait named (only while it waits to be sent)."""
    if message.status not in CLAIMABLE:
        return []
    providers = paused_providers(message.last_error)
    return [
        p
        for p in pauses
        if p.scope is Scope.FLEET
        or (p.scope is Scope.TENANT and p.target == message.tenant_id)
        or (p.scope is Scope.PROVIDER and p.target in providers)
    ]
