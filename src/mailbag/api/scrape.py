"""GET /metrics: the process's (or, under `mailbag api --workers N`, every API process's)
Prometheus series, and the outbox's gauges read from the database.

A scrape costs a bounded amount of database work however large the outbox grows and however
often it is scraped: the gauges are read at most once per METRICS_CACHE_SECONDS in each
process (`OutboxGaugeCache`), in three statements that each read a bounded range of an index
(store.stats.outbox_gauges), and two that read the fleet's state (pauses and breakers, a few
rows each). Between reads, and while the database is down, a scrape reports the last
reading; `mailbag_outbox_gauges_read_timestamp_seconds` says when it was taken.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import SQLAlchemyError

from mailbag import metrics, metrics_server
from mailbag.api.problems import unauthorized
from mailbag.keys import bearer_matches
from mailbag.services.container import Services
from mailbag.services.pauses import oldest_by_scope
from mailbag.store import fleet_state, sender_domains, stats
from mailbag.store.database import within
from mailbag.store.session import AsyncDatabase

logger = structlog.get_logger("mailbag.metrics")

# Whatever keeps the database from answering leaves the process's own metrics to report.
READ_FAILED = (SQLAlchemyError, ConnectionError, OSError, TimeoutError)

router = APIRouter()


class OutboxGaugeCache:
    """At most one read of the outbox's gauges per `seconds` in this process.

    The window starts when a read ends, whether it succeeded or not: during an outage each
    process tries once per window, not once per scrape (each try bounded by its deadline)."""

    def __init__(self, seconds: float, *, monotonic: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self._monotonic = monotonic
        self._read_at: float | None = None  # when the last read ended
        self._lock = asyncio.Lock()

    def _due(self) -> bool:
        return self._read_at is None or self._monotonic() - self._read_at >= self.seconds

    async def refresh(self, read: Callable[[], Awaitable[None]]) -> bool:
        """Run `read` if the window has passed: did it run? One read at a time; a scrape
        that arrives during a read waits for its values rather than reading again."""
        if not self._due():
            return False
        async with self._lock:
            if not self._due():  # read meanwhile, by the scrape this one waited for
                return False
            try:
                await read()
            finally:
                self._read_at = self._monotonic()
        return True


def install(app: FastAPI, seconds: float) -> None:
    """Serve /metrics from `app`, reading the outbox's gauges at most once per `seconds`."""
    app.state.outbox_gauges = OutboxGaugeCache(seconds)
    app.include_router(router)


@router.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
async def prometheus_metrics(request: Request) -> Response:
    """Prometheus metrics; the outbox-wide gauges are read from the database at most once
    per METRICS_CACHE_SECONDS per process. With METRICS_TOKEN set, only for
    `Authorization: Bearer <METRICS_TOKEN>`."""
    svc: Services = request.app.state.services
    settings = svc.settings
    token = settings.metrics_token
    if token is not None and not bearer_matches(request.headers.get("authorization"), token):
        raise unauthorized(metrics_server.UNAUTHORIZED_DETAIL, metrics_server.CHALLENGE)
    cache: OutboxGaugeCache = request.app.state.outbox_gauges

    async def read() -> None:
        try:
            # Within half the request's deadline: during an outage, when metrics matter
            # most, the process's own metrics still come out.
            await within(settings.database_timeout_seconds / 2, read_outbox_gauges(svc))
        except READ_FAILED as exc:
            logger.warning("outbox gauges not read", error=type(exc).__name__)

    await cache.refresh(read)
    return Response(generate_latest(metrics.registry()), media_type=CONTENT_TYPE_LATEST)


async def read_outbox_gauges(svc: Services) -> None:
    """Read the outbox's numbers from the database and set the gauges to them."""
    now = svc.clock()
    async with AsyncDatabase(svc.engine).connect(read_only=True) as tx:
        gauges = await tx.run(stats.outbox_gauges(now))
        fleet = await tx.run(fleet_state.read())  # two small tables
        not_ready = await tx.run(sender_domains.not_ready_count())
    for state, count in gauges.counts.items():
        metrics.MESSAGES.labels(state).set(count)
    oldest_due = gauges.oldest_due
    metrics.OLDEST_DUE_AGE.set(max(0.0, (now - oldest_due).total_seconds()) if oldest_due else 0)
    metrics.UNMATCHED_STORED.set(gauges.unmatched_provider_events)
    for scope, (count, oldest) in oldest_by_scope(fleet.pauses, now).items():
        metrics.PAUSES.labels(scope.value).set(count)
        metrics.PAUSE_AGE.labels(scope.value).set(oldest)
    metrics.SENDER_DOMAINS_NOT_READY.set(not_ready)
    metrics.OUTBOX_READ_AT.set(now.timestamp())
