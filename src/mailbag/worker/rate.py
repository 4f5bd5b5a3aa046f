"""PROVIDER_RATE as one worker meets it: slots taken for each claim, throttles reported to
the fleet (domain.rate has the rules, store/rate.py the SQL).

- `reserve` is one short transaction per claimed batch (one statement on PostgreSQL and
  SQLite), bounded by the database timeout like every worker call.
- `report_throttle` lowers the rate for every replica; at most one report is in flight per
  worker (a burst of 429s is one report; the row's `settles_at` makes other replicas'
  reports of the same burst only extend the cooldown anyway).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag import metrics
from mailbag.domain.rate import Grant, RateLimit, SendSlot
from mailbag.store import rate as store
from mailbag.store.database import within
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase
from mailbag.worker.failures import DB_ERRORS

if TYPE_CHECKING:
    from mailbag.settings import Settings

T = TypeVar("T")


def rate_limit(settings: Settings) -> RateLimit | None:
    """PROVIDER_RATE and its cooldown; None when no rate is set."""
    if settings.provider_rate is None:
        return None
    return RateLimit(settings.provider_rate, settings.provider_rate_cooldown_seconds)


@dataclass(frozen=True)
class Slots:
    """A grant, and this worker's monotonic time when it came back."""

    grant: Grant
    received: float

    def slot(self, index: int) -> SendSlot:
        """Slot `index`: nothing of it leaves before its monotonic time."""
        return SendSlot(self.received + self.grant.delay(index), self.grant.rate)

    @property
    def schedule_end(self) -> float:
        """The monotonic time when the fleet's schedule, as this grant left it, runs out."""
        return self.received + self.grant.ahead


class FleetRate:
    def __init__(
        self, engine: AsyncEngine, *, provider: str, limit: RateLimit, timeout: float, log: Any
    ) -> None:
        self.db = AsyncDatabase(engine)
        self.provider, self.limit, self.timeout, self.log = provider, limit, timeout, log
        self.in_force = limit.per_second  # as the last grant said
        self.reporting: asyncio.Task[None] | None = None

    async def reserve(self, count: int) -> Slots:
        plan = store.reserve(
            provider=self.provider,
            count=count,
            rate=self.limit.per_second,
            cooldown=self.limit.cooldown,
        )
        grant = await within(self.timeout, self._run(plan))
        received = time.monotonic()
        if grant.rate != self.in_force:
            self.log.info("provider_rate_in_force", per_second=round(grant.rate, 3))
            metrics.PROVIDER_RATE_IN_FORCE.set(grant.rate)
        self.in_force = grant.rate
        return Slots(grant, received)

    def report_throttle(self, retry_after: timedelta | None) -> bool:
        """Tell the fleet the provider throttled a send (in the background). False when a
        report is still on its way: this throttle is of the same burst."""
        if self.reporting is not None and not self.reporting.done():
            return False
        self.reporting = asyncio.create_task(self._report(retry_after))
        return True

    async def _report(self, retry_after: timedelta | None) -> None:
        plan = store.throttle(
            provider=self.provider,
            rate=self.limit.per_second,
            cooldown=self.limit.cooldown,
            retry_after=retry_after.total_seconds() if retry_after else None,
        )
        try:
            await within(self.timeout, self._run(plan))
        except DB_ERRORS as exc:  # the next throttle reports again; sends stay released
            self.log.warning("provider_throttle_not_recorded", error=type(exc).__name__)

    async def _run(self, plan: Plan[T]) -> T:
        async with self.db.transaction() as tx:
            return await tx.run(plan)

    async def aclose(self) -> None:
        """Wait for a report in flight (the drain calls this)."""
        if self.reporting is not None:
            await asyncio.gather(self.reporting, return_exceptions=True)
