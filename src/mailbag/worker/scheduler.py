"""One scheduler among N replicas: the periodic jobs that must run once across the fleet
(reconciliation, purge, expiries) run on the one replica that holds a database lock.

The lock, per database (`lock_for`; store/leadership.py has how each works):
- PostgreSQL: a session advisory lock on a connection of its own to SESSION_URL
  (LISTEN_URL, else DATABASE_URL): behind a transaction pooler a session lock needs a
  direct connection (a lock session that changes backends is noticed and given up);
- MariaDB/MySQL: `GET_LOCK` on a connection of its own;
- SQLite: an exclusive `flock` on a file beside the database. Usually one process uses the
  file (`serve`) and always wins; a second process on the same file (a `worker` beside
  it) waits its turn like a replica. An in-memory database has a single process: it leads.

Failover: a lock lives as long as its session. When the holder's process dies, its
connection closes and the server frees the lock (a vanished host: the lock session's TCP
keepalives on PostgreSQL, its `wait_timeout` on MariaDB, both a few leases long). The
other replicas try to take it every SCHEDULER_LEASE_SECONDS, so a dead holder is replaced
within a lease. The holder confirms the lock is still its own before each job it starts
and at least every third of a lease, and steps down when it is not: its running jobs are
cancelled (each job is safe to run twice meanwhile; they run on one replica to save work).

The scheduler is one of the worker's periodic jobs (`Scheduler.as_job`) that ticks often;
each job it runs is a task of its own, so that a long purge never delays the ticks that
keep the lock. A job that fails (a database error, or a bug) fails that run: it is logged,
counted in `mailbag_side_task_failures_total{task=<job>}`, and the job runs again when it
is next due. Scheduled jobs are optional: none of them ever stops mail.
`mailbag_scheduler_leader` is 1 on the replica that leads, 0 elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

from mailbag import log, metrics
from mailbag.clock import Clock, utcnow
from mailbag.database_url import dialect_of
from mailbag.metrics import SCHEDULER_LEADER
from mailbag.services import maintenance
from mailbag.store.leadership import FileLock, Lock, LockLost, OnlyProcess, SessionLock
from mailbag.worker.config import PeriodicJob
from mailbag.worker.failures import DB_ERRORS

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from mailbag.settings import Settings


def lock_for(settings: Settings) -> Lock:
    """The scheduler lock for this deployment's database (see the module's docstring)."""
    if dialect_of(settings.database_url) != "sqlite":
        return SessionLock(
            settings.session_url,
            lease=settings.scheduler_lease_seconds,
            timeout=settings.database_timeout_seconds,
        )
    database = make_url(settings.database_url).database
    if not database or database == ":memory:" or os.name != "posix":
        return OnlyProcess()
    return FileLock(Path(f"{database}-scheduler"))


@dataclass
class _Slot:
    job: PeriodicJob
    due: float = 0.0  # monotonic seconds
    task: asyncio.Task[None] | None = None


class Scheduler:
    """Runs `jobs` while this replica holds `lock`; tries to take it every `lease`."""

    def __init__(
        self,
        lock: Lock,
        jobs: Sequence[PeriodicJob],
        *,
        lease: float,
        worker_id: str,
        clock: Clock = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lock, self.lease = lock, lease
        self.slots = [_Slot(job) for job in jobs]
        self.clock, self.monotonic = clock, monotonic
        self.log = log.get("mailbag.scheduler", worker_id=worker_id)
        self.leader = False
        self.next_try = 0.0  # when a follower tries to take the lock next (monotonic)
        self.confirmed = 0.0  # when the leader last found the lock its own
        SCHEDULER_LEADER.set(0)

    @property
    def tick_every(self) -> float:
        # Often enough to confirm the lock three times a lease and to start a job on time.
        shortest = min((slot.job.every for slot in self.slots), default=self.lease)
        return max(0.05, min(1.0, self.lease / 3, shortest))

    def as_job(self) -> PeriodicJob:
        """The scheduler as one of the worker's periodic jobs."""
        return PeriodicJob("scheduler", self.tick_every, self.tick, self.close)

    async def tick(self, now: datetime) -> Mapping[str, int]:
        at = self.monotonic()
        due = [slot for slot in self.slots if slot.task is None and slot.due <= at]
        if self.leader and (due or at - self.confirmed >= self.lease / 3):
            await self._confirm(at)
        if not self.leader and at >= self.next_try:
            self.next_try = at + self.lease
            await self._try_to_lead(at)
            due = self.slots if self.leader else []  # a new leader runs every job at once
        if self.leader:
            for slot in due:
                slot.due = at + slot.job.every
                slot.task = asyncio.create_task(self._run(slot), name=f"scheduled {slot.job.name}")
                slot.task.add_done_callback(functools.partial(self._ended, slot))
        return {}

    async def close(self) -> None:
        """The worker stopped: cancel what runs, give the lock up for the next replica."""
        await self._cancel_jobs()
        was_leader, self.leader = self.leader, False
        SCHEDULER_LEADER.set(0)
        with contextlib.suppress(*DB_ERRORS, LockLost):
            await self.lock.release()
        if isinstance(self.lock, SessionLock):
            await self.lock.dispose()
        if was_leader:
            self.log.info("scheduler_leader_released", lock=self.lock.kind)

    async def _try_to_lead(self, at: float) -> None:
        try:
            got = await self.lock.acquire()
        except (*DB_ERRORS, LockLost) as exc:
            self.log.warning("scheduler_lock_unavailable", lock=self.lock.kind, error=_why(exc))
            return
        if got:
            self.leader, self.confirmed = True, at
            SCHEDULER_LEADER.set(1)
            self.log.info(
                "scheduler_leader_gained",
                lock=self.lock.kind,
                jobs=[slot.job.name for slot in self.slots],
            )

    async def _confirm(self, at: float) -> None:
        try:
            held = await self.lock.held()
            reason = "the lock is no longer this replica's"
        except (*DB_ERRORS, LockLost) as exc:
            held, reason = False, _why(exc)
        if held:
            self.confirmed = at
            return
        self.leader = False
        self.next_try = at + self.lease  # another replica may hold it now: let it lead
        SCHEDULER_LEADER.set(0)
        self.log.warning("scheduler_leader_lost", lock=self.lock.kind, reason=reason)
        await self._cancel_jobs()

    async def _run(self, slot: _Slot) -> None:
        started = self.monotonic()
        try:
            outcome = await slot.job.run(self.clock())
        except DB_ERRORS as exc:
            self.log.warning("scheduled_job_failed", job=slot.job.name, error=_why(exc))
            return
        except Exception as exc:  # a bug in one job: that run fails, the scheduler goes on
            metrics.SIDE_TASK_FAILURES.labels(slot.job.name).inc()
            self.log.error(
                "scheduled_job_failed", job=slot.job.name, error=type(exc).__name__, exc_info=exc
            )
            return
        seconds = round(self.monotonic() - started, 3)
        self.log.info("scheduled_job_done", job=slot.job.name, seconds=seconds, **outcome)

    def _ended(self, slot: _Slot, task: asyncio.Task[None]) -> None:
        slot.task = None

    async def _cancel_jobs(self) -> None:
        tasks = [slot.task for slot in self.slots if slot.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _why(exc: BaseException) -> str:
    # A lock error's text could quote the connection's address; its type says enough.
    return str(exc) if isinstance(exc, LockLost) else type(exc).__name__


def maintenance_jobs(settings: Settings, engine: AsyncEngine) -> list[PeriodicJob]:
    """Purge (by each tenant's PURGE_AFTER_DAYS, or the setting's), expired idempotency
    records, stale verifications and quiet recipient domains' schedules (DOMAIN_SHAPING),
    every MAINTENANCE_EVERY_SECONDS, on the worker's
    engine; sender domains' DNS checks as often as DOMAIN_CHECK_EVERY_SECONDS asks."""
    every = settings.maintenance_every_seconds
    jobs = [
        PeriodicJob(
            "sender_domains_checked",
            min(every, settings.domain_check_every_seconds),
            functools.partial(maintenance.check_sender_domains, engine, settings),
        ),
        PeriodicJob(
            "idempotency_records_expired",
            every,
            functools.partial(maintenance.drop_expired_records, engine),
        ),
        PeriodicJob(
            "verifications_expired",
            every,
            functools.partial(maintenance.expire_verifications, engine),
        ),
        PeriodicJob(
            "recipient_domains_forgotten",
            every,
            functools.partial(maintenance.forget_quiet_domains, engine),
        ),
    ]

    async def purge(now: datetime) -> Mapping[str, int]:
        # Each tenant's own PURGE_AFTER_DAYS first (`mailbag tenants retention`), then the
        # setting's for the others: a tenant may keep mail longer, or shorter, or forever.
        return await maintenance.purge_by_retention(
            engine, now=now, default_days=settings.purge_after_days
        )

    jobs.insert(0, PeriodicJob("purged", every, purge))
    return jobs


def elect(settings: Settings, jobs: Sequence[PeriodicJob]) -> PeriodicJob:
    """`jobs`, run once across the fleet: the worker's periodic job that elects and runs."""
    scheduler = Scheduler(
        lock_for(settings),
        jobs,
        lease=settings.scheduler_lease_seconds,
        worker_id=settings.worker_id,
    )
    return scheduler.as_job()
