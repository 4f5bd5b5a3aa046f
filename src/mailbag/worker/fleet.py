"""The providers a worker sends through, which one each message goes to, and what the fleet
shares about them (their breakers, operators' pauses: store/fleet_state.py).

- `Fleet.choose` picks a message's provider: the first of its route (domain.routing) that
  is available, neither paused nor behind an open breaker (one whose wait is over takes one
  probe at a time from this worker). A message retried under an ambiguous send's
  idempotency key goes to the provider that key was sent to, or waits for it: another
  provider knows nothing of the key and could send the message a second time.
- `Fleet.note` counts what each answer says of its provider (an answer closes its breaker,
  a sure refusal adds to its failures in a row); `exchange` writes that and reads the
  fleet's state back, at most once a poll interval, in the claim's own transaction (`sync`
  alone while the fleet is paused, and at the drain). While LISTEN is known to work
  (PostgreSQL: `listening`), every change is announced (`heard`) and the state is read only
  then, when there is something to write, or every TOLD_RECHECK_SECONDS.
- A message none of whose providers is available waits, no attempt spent, until the first
  of them may be tried again (`wait_until`).
- The sender domains' signing keys (worker/signing.py) are read in the same exchange, at
  most every 30 s, and at the next one after a change is announced.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag import metrics
from mailbag.domain import delivery
from mailbag.domain.breaker import Breaker
from mailbag.domain.dkim import SigningKey
from mailbag.domain.message import Message
from mailbag.domain.routing import PAUSED, TENANT_ACCOUNT, Routing, sure_refusal, waiting_reason
from mailbag.providers.base import Provider
from mailbag.settings import InvalidSettings, Settings
from mailbag.store import fleet_state
from mailbag.store.database import within
from mailbag.store.fleet_state import FleetState, Scope
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase
from mailbag.worker.failures import DB_ERRORS
from mailbag.worker.signing import Signing

if TYPE_CHECKING:
    from mailbag.services.tenant_accounts import TenantAccount

T = TypeVar("T")

# How soon a message that waits for a paused provider is looked at again: a resume takes
# effect within this long (the breaker's waits say their own end).
PAUSED_RECHECK = timedelta(seconds=30)
# ... and one that waits for another's probe of its provider: the probe's answer is known
# to the fleet within a poll interval of coming back.
PROBE_RECHECK = timedelta(seconds=1)
# With every change announced, the state is still read this often: a NOTIFY lost with a
# connection cut without a word (a partition, until keepalives notice) costs no more.
TOLD_RECHECK_SECONDS = 5.0


def tables(settings: Settings) -> dict[str, tuple[str, Settings]]:
    """Each `[providers.NAME]` table's kind and the settings its provider is built from,
    every one checked (its kind is registered, what the kind requires is set), none built:
    InvalidSettings names the table and the key."""
    from mailbag import providers

    found: dict[str, tuple[str, Settings]] = {}
    for name in settings.providers:
        kind, own = settings.provider_table(name)
        if kind not in providers.available():
            raise InvalidSettings(
                f"providers.{name}.kind: no provider {kind[:60]!r} is registered"
                f" (available: {', '.join(providers.available())})"
            )
        for key in providers.capabilities(kind).required_settings:
            if getattr(own, f"{kind}_{key}") in (None, ""):
                raise InvalidSettings(f"providers.{name}.{key}: {kind} cannot send without it")
        found[name] = kind, own
    return found


def from_settings(settings: Settings) -> Fleet:
    """The providers the settings name, built: PROVIDER alone, or every `[providers.NAME]`
    table (all checked first) with the routes; tenants' own accounts when a route names
    them (built as the fleet reads them)."""
    from mailbag import providers

    signing = Signing.of(settings)
    if not settings.providers:
        alone = providers.create(settings.provider, settings)
        return Fleet.single(alone, breaker=settings.provider_breaker, signing=signing)
    members = {name: providers.create(kind, own) for name, (kind, own) in tables(settings).items()}
    accounts = Accounts(settings) if TENANT_ACCOUNT in settings.routing.providers else None
    return Fleet(
        members,
        settings.routing,
        breaker=settings.provider_breaker,
        accounts=accounts,
        signing=signing,
    )


def account_name(tenant_id: str) -> str:
    """The provider name of a tenant's own account: its breaker's, the messages' it sent
    (50 characters at most, as messages.provider holds; a long tenant id is hashed)."""
    if len(tenant_id) > 42:
        tenant_id = hashlib.sha256(tenant_id.encode()).hexdigest()[:16]
    return f"{TENANT_ACCOUNT}:{tenant_id}"


def metric_label(name: str) -> str:
    """A provider's name as metrics say it: every tenant's own account is `tenant` (no
    tenant ids in labels)."""
    return TENANT_ACCOUNT if name.startswith(f"{TENANT_ACCOUNT}:") else name


class Accounts:
    """Tenants' own accounts (services/tenant_accounts.py), read with the fleet's state and
    built into providers; one that is replaced or removed is closed with the fleet."""

    def __init__(self, settings: Settings) -> None:
        from mailbag.services.tenant_accounts import account_box

        self.settings, self.box = settings, account_box(settings)
        self.seen: dict[str, datetime] = {}  # tenant id: the account's updated_at, as built
        self.active: set[str] = set()  # their providers' names
        self.retired: list[Provider] = []

    def plan(self) -> Plan[dict[str, TenantAccount]]:
        from mailbag.services.tenant_accounts import opened

        return opened(self.box)

    def update(
        self, members: dict[str, Provider], found: Mapping[str, TenantAccount], log: Any
    ) -> None:
        """Build what is new or changed into `members`; what is gone is never chosen again
        (its provider stays a member for the sends in flight, closed with the fleet)."""
        from mailbag import providers

        for tenant_id in [t for t in self.seen if t not in found]:
            del self.seen[tenant_id]
            self.active.discard(account_name(tenant_id))
        for tenant_id, account in found.items():
            if self.seen.get(tenant_id) == account.updated_at:
                continue
            name = account_name(tenant_id)
            try:
                own = self.settings.for_provider(account.kind, account.settings, where=name)
                built = providers.create(account.kind, own)
            except Exception as exc:  # one tenant's account costs no other tenant anything
                log.warning("tenant_account_unusable", tenant=tenant_id, error=type(exc).__name__)
                continue
            if name in members:
                self.retired.append(members[name])
            members[name] = built
            self.seen[tenant_id] = account.updated_at
            self.active.add(name)


class Fleet:
    def __init__(
        self,
        members: Mapping[str, Provider],
        routing: Routing,
        *,
        breaker: Breaker | None = None,
        accounts: Accounts | None = None,
        signing: Signing | None = None,
    ) -> None:
        self.members, self.routing, self.accounts = dict(members), routing, accounts
        self.signing = signing
        self.breaker = breaker or Breaker()
        self.state = FleetState()
        self.probing: set[str] = set()  # providers with a probe of this worker's in flight
        self.answered: set[str] = set()
        self.failed: dict[str, tuple[int, str]] = {}
        self.synced = -float("inf")  # monotonic time of the last exchange
        self.told = False  # LISTEN is known to hear every change announced (store/listen.py)
        self.changed = True  # ... and one was, or may have been, since the last read
        self.sending: tuple[set[str], dict[str, tuple[int, str]]] = (set(), {})
        self.learned: tuple[dict[str, datetime], Mapping[str, TenantAccount]] = ({}, {})
        self.keys_read: Mapping[tuple[str, str], SigningKey] | None = None

    @classmethod
    def single(
        cls, provider: Provider, *, breaker: Breaker | None = None, signing: Signing | None = None
    ) -> Fleet:
        """One provider, named after its kind: a deployment with only PROVIDER set."""
        routing = Routing.single(provider.name)
        return cls({provider.name: provider}, routing, breaker=breaker, signing=signing)

    @property
    def signing_keys(self) -> Mapping[tuple[str, str], SigningKey]:
        """The sender domains' keys, by (tenant, domain), as last read."""
        return self.signing.keys if self.signing is not None else {}

    @property
    def alone(self) -> bool:
        return len(self.members) == 1

    def route(self, message: Message) -> tuple[str, ...]:
        """The providers `message` may go through, in order: its route's, `tenant` standing
        for its tenant's own account (left out when the tenant has none)."""
        if not self.routing.routes and self.accounts is None:  # one route: no need to look
            return self.routing.default.providers
        recipients = [address.address for address in message.all_recipients]
        route = self.routing.route_for(message.tenant_id, message.tags, recipients)
        if TENANT_ACCOUNT not in route.providers:
            return route.providers
        own = account_name(message.tenant_id)
        return tuple(
            own if name == TENANT_ACCOUNT else name
            for name in route.providers
            if name != TENANT_ACCOUNT or own in self._active_accounts
        )

    @property
    def _active_accounts(self) -> set[str]:
        return self.accounts.active if self.accounts is not None else set()

    async def aclose(self) -> None:
        retired = self.accounts.retired if self.accounts is not None else []
        for provider in [*self.members.values(), *retired]:
            await provider.aclose()

    def available(self, name: str, now: datetime) -> bool:
        if name not in self.members or self.state.paused(Scope.PROVIDER, name):
            return False
        if metric_label(name) != name and name not in self._active_accounts:
            return False  # a tenant's account since removed
        health = self.state.health.get(name)
        if health is None or not self.breaker.is_open(health.failures_in_row):
            return True
        if health.open_until is not None and health.open_until > now:
            return False
        return name not in self.probing  # past the wait: one probe at a time

    def sole(self, now: datetime) -> str | None:
        """The one provider every message goes to now, for a deployment of one provider
        that is available with its breaker closed (the usual case: no choice to make per
        message); None otherwise."""
        if not self.alone or self.routing.routes or self.accounts is not None:
            return None
        (name,) = self.members
        available = self.available(name, now) and not self._breaker_open(name)
        return name if available else None

    def choose(self, message: Message, now: datetime, tried: Iterable[str] = ()) -> str | None:
        """The provider `message` goes to now, or None: it waits."""
        done = set(tried)
        if message.ambiguous_since is not None and message.provider in self.members:
            own = message.provider  # the one that holds its idempotency key
            return own if own not in done and self.available(own, now) else None
        for name in self.route(message):
            if name not in done and self.available(name, now):
                if self._breaker_open(name):
                    self.probing.add(name)
                return name
        return None

    def wait_until(self, message: Message, now: datetime) -> datetime:
        """When a message with no available provider may be looked at again: the first end
        of its providers' breaker waits, or a while for a paused one."""
        ends = []
        for name in self.route(message):
            health = self.state.health.get(name)
            if self.state.paused(Scope.PROVIDER, name) or name not in self.members:
                ends.append(now + PAUSED_RECHECK)
            elif health is not None and health.open_until is not None and health.open_until > now:
                ends.append(health.open_until)
            else:
                ends.append(now + PROBE_RECHECK)
        return min(ends, default=now + PAUSED_RECHECK)

    def why_waiting(self, message: Message, now: datetime) -> str:
        states = {}
        for name in self.route(message):
            if self.state.paused(Scope.PROVIDER, name):
                states[name] = PAUSED.strip()
            elif (health := self.state.health.get(name)) and health.open_until:
                states[name] = f"failing ({health.last_error or 'no answer'})"
            else:
                states[name] = "probing"
        return waiting_reason(states)

    def note(self, name: str, outcome: delivery.SendOutcome) -> None:
        """What one answer of `name` says about it."""
        self.probing.discard(name)
        if type(outcome) is delivery.Accepted:  # the usual answer, first
            self.answered.add(name)
            return
        if sure_refusal(outcome) and not isinstance(outcome, delivery.Throttled):
            count, _ = self.failed.get(name, (0, ""))
            self.failed[name] = (count + 1, getattr(outcome, "error", "") or "")
        elif not isinstance(outcome, delivery.Throttled):
            self.answered.add(name)  # it answered (even a refusal of the message, or maybe)

    def paused_tenants(self) -> frozenset[str]:
        return self.state.paused_targets(Scope.TENANT)

    @property
    def fleet_paused(self) -> bool:
        return self.state.paused(Scope.FLEET)

    def _breaker_open(self, name: str) -> bool:
        health = self.state.health.get(name)
        return health is not None and self.breaker.is_open(health.failures_in_row)

    def heard(self, payload: str | None) -> None:
        """A NOTIFY LISTEN passed on (None: it reconnected, and one may have been missed)."""
        if payload is None or payload == fleet_state.CHANGED:
            self.changed = True
            if self.signing is not None:
                self.signing.stale = True

    def listening(self, working: bool) -> None:
        """LISTEN is known to hear every announcement from now (True), or no longer."""
        self.told, self.changed = working, True

    def exchange(self, *, now: datetime, every: float) -> Plan[None] | None:
        """When it is due (at most every `every` seconds), the plan that writes what this
        worker learned and reads the fleet's state (two reads when there is nothing to
        write, the usual case), to run in the claim's transaction or alone (`sync`); then
        `exchanged`, or `not_exchanged` if it failed. None when it is not due: too soon,
        or, told of every change, nothing changed and nothing is to be written."""
        since = time.monotonic() - self.synced
        if since < every:
            return None
        # An answer only needs writing where the fleet's state says its provider failed.
        failing = {name for name, health in self.state.health.items() if health.failures_in_row}
        answered, failed = self.answered & failing, self.failed
        keys_due = self.signing is not None and self.signing.due()
        quiet = not (self.changed or answered or failed or keys_due)
        if self.told and quiet and since < TOLD_RECHECK_SECONDS:
            return None
        self.changed = False  # before the read: a change announced while it runs is kept
        self.sending = (answered, failed)
        self.answered, self.failed = set(), {}
        return self._exchange(answered, failed, now)

    def exchanged(self, log: Any) -> None:
        self.synced = time.monotonic()
        opened, found = self.learned
        if self.accounts is not None:
            self.accounts.update(self.members, found, log)
        if self.signing is not None and self.keys_read is not None:
            self.signing.update(self.keys_read)
        for name in self.members:
            if metric_label(name) == name:  # the tables' (tenants' accounts are many)
                open_ = 1 if self._breaker_open(name) else 0
                metrics.PROVIDER_BREAKER_OPEN.labels(name).set(open_)
        for name, until in opened.items():
            log.warning("provider_breaker_open", provider=name, until=until.isoformat())

    def not_exchanged(self, exc: BaseException, log: Any) -> None:
        """The exchange failed: the last state stands, the counts wait for the next one."""
        answered, failed = self.sending
        self.changed = True
        self.answered |= answered
        for name, (count, error) in failed.items():
            self.failed[name] = (self.failed.get(name, (0, ""))[0] + count, error)
        log.warning("fleet_state_unavailable", error=type(exc).__name__)

    async def sync(
        self, engine: AsyncEngine, *, now: datetime, every: float, db_timeout: float, log: Any
    ) -> None:
        """The exchange (when due) in a transaction of its own; a database error keeps the
        last state."""
        exchange = self.exchange(now=now, every=every)
        if exchange is None:
            return
        try:
            await within(db_timeout, _in_transaction(engine, exchange))
        except DB_ERRORS as exc:
            self.not_exchanged(exc, log)
            return
        self.exchanged(log)

    def _exchange(
        self, answered: set[str], failed: dict[str, tuple[int, str]], now: datetime
    ) -> Plan[None]:
        opened: dict[str, datetime] = {}
        if answered or failed:
            opened = yield from fleet_state.record(
                answered=answered, failed=failed, now=now, breaker=self.breaker
            )
        keys_due = self.signing is not None and self.signing.due()
        self.state = yield from fleet_state.read(last=self.accounts is None and not keys_due)
        found: Mapping[str, TenantAccount] = {}
        if self.accounts is not None:
            found = yield from self.accounts.plan()
        self.keys_read = None
        if self.signing is not None and keys_due:
            self.keys_read = yield from self.signing.plan()
        self.learned = opened, found


async def _in_transaction(engine: AsyncEngine, plan: Plan[T]) -> T:
    # Cached statements in a transaction: a pipeline's compile and its switch to autocommit
    # cost more here than the round trips they would save.
    async with AsyncDatabase(engine).transaction() as tx:
        return await tx.run(plan)
