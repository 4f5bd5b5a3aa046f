"""DOMAIN_SHAPING as one worker meets it: the shaped domains read once a poll interval,
claimed messages of a shaped domain placed in its schedule, deferrals reported to the
fleet (domain.domain_shaping has the rules, store/domain_rates.py the SQL).

- `refresh` is the read of the domains still lowered, due at most once a poll interval and
  run inside the claim's transaction (no round trip of its own). With no shaped domain
  (the usual case) `admit` hands a claim back as it is: no database work, no look at any
  message.
- `admit` takes, per shaped domain in a claim, one statement's slots (none while the
  domain's line runs HORIZON_SECONDS ahead) and says which messages go now and which wait,
  released unsent and with no attempt spent.
- `deferred` reports a domain's deferral in the background, at most one report in flight
  per domain (a burst is one report; the row's `settles_at` makes the others' reports of
  the same burst only restart the recovery), and shapes the domain here as soon as the
  report comes back. A report that fails is logged: the next deferral reports again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag import metrics
from mailbag.clock import Clock
from mailbag.domain import domain_shaping as rules
from mailbag.domain.delivery import SendOutcome
from mailbag.domain.domain_shaping import Shaping, View
from mailbag.domain.message import Message
from mailbag.domain.rate import Bucket
from mailbag.store import domain_rates as store
from mailbag.store.database import within
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase

T = TypeVar("T")

Waiting = list[tuple[Message, str, datetime]]  # released unsent: why, and when due again


class DomainShaper:
    def __init__(
        self,
        engine: AsyncEngine,
        shaping: Shaping,
        *,
        poll_interval: float,
        timeout: float,
        clock: Clock,
        log: Any,
    ) -> None:
        self.db = AsyncDatabase(engine)
        self.shaping, self.poll_interval, self.timeout = shaping, poll_interval, timeout
        self.clock, self.log = clock, log
        self.settle = rules.settle_seconds(poll_interval)
        self.views: dict[str, View] = {}  # the shaped domains, as this worker knows them
        self.read_at = -float("inf")  # monotonic time of the last read
        self.reports: dict[str, asyncio.Task[None]] = {}

    def refresh(self) -> Plan[None] | None:
        """The read of the shaped domains when it is due (once a poll interval), else None."""
        if time.monotonic() - self.read_at < self.poll_interval:
            return None
        return self._read()

    def _read(self) -> Plan[None]:
        rows = yield from store.shaped()
        now = self.clock()
        views = {}
        for domain, (bucket, db_now) in rows.items():
            view = rules.view_of(bucket, self.shaping, db_now=db_now, now=now)
            if view is not None:
                known = self.views.get(domain)  # keep the line this worker has put up
                if known is not None:
                    view = replace(view, in_line_until=known.in_line_until)
                views[domain] = view
        self.views, self.read_at = views, time.monotonic()
        metrics.SHAPED_DOMAINS.set(len(views))

    async def admit(self, messages: Sequence[Message]) -> tuple[list[Message], Waiting]:
        """The claimed messages that go now, and those that wait for their domain's slot."""
        if not self.views:  # the usual case: nothing is shaped
            return list(messages), []
        now = self.clock()
        groups: dict[str, list[Message]] = {}
        for message in messages:
            if rules.holds_slot(message):
                continue
            domain = rules.domain_of(message.to_address)
            view = self.views.get(domain)
            if view is None:
                continue
            if view.until <= now:  # climbed back since the last read
                del self.views[domain]
                continue
            groups.setdefault(domain, []).append(message)
        if not groups:
            return list(messages), []
        waiting: Waiting = []
        for domain, group in groups.items():
            view = self.views[domain]
            count = rules.slots_to_take(view, len(group), now)
            grant = None
            if count:
                plan = store.reserve(domain=domain, count=count, shaping=self.shaping)
                grant = await self._run(plan)
            now = self.clock()
            placed = rules.place(domain, group, view, grant, now)
            self.views[domain] = placed.view
            waiting += placed.waiting
        held = {message.id for message, _, _ in waiting}
        metrics.DOMAIN_SHAPED_RELEASES.inc(len(held))
        return [message for message in messages if message.id not in held], waiting

    def deferred(self, message: Message, outcome: SendOutcome | None) -> bool:
        """Whether `outcome` is `message`'s recipient domain deferring it; if so, the fleet
        is told (in the background)."""
        domain = rules.deferral_of(message, outcome)
        if domain is None:
            return False
        metrics.DOMAIN_DEFERRALS.inc()
        reporting = self.reports.get(domain)
        if reporting is None or reporting.done():
            self.reports[domain] = asyncio.create_task(self._report(domain))
        return True

    async def _report(self, domain: str) -> None:
        plan = store.defer(domain=domain, shaping=self.shaping, settle=self.settle)
        try:
            bucket, db_now = await self._run(plan)
        except Exception as exc:  # an optional part: the next deferral reports again
            self.log.warning("domain_deferral_not_recorded", error=type(exc).__name__)
            return
        finally:
            if self.reports.get(domain) is asyncio.current_task():
                del self.reports[domain]
        self._learned(domain, bucket, db_now)

    def _learned(self, domain: str, bucket: Bucket, db_now: float) -> None:
        view = rules.view_of(bucket, self.shaping, db_now=db_now, now=self.clock())
        if view is None:
            return
        known = self.views.get(domain)
        if known is None or round(known.per_minute, 3) != round(view.per_minute, 3):
            self.log.warning(
                "recipient_domain_slowed", domain=domain, per_minute=round(view.per_minute, 3)
            )
        if known is not None:
            view = replace(view, in_line_until=known.in_line_until)
        self.views[domain] = view

    async def _run(self, plan: Plan[T]) -> T:
        async def run() -> T:
            async with self.db.transaction() as tx:
                return await tx.run(plan)

        return await within(self.timeout, run())

    async def aclose(self) -> None:
        """Wait for the reports in flight (the drain calls this)."""
        await asyncio.gather(*self.reports.values(), return_exceptions=True)
