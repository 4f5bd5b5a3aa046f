"""The worker's loop: sweep -> claim -> dispatch -> wait, until told to stop; then drain.

Each claimed chunk is sent by its own task (`Sender.attempt`); the ledger counts what is
held and the free slots; decisions go to the outcome writer, which writes them in batches;
the lease keeper extends everything held. Those side tasks are supervised: one that dies
stops the worker as SIGTERM would, and `run` raises WorkerFailed once drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag import log, metrics, wakeup
from mailbag.clock import Clock, utcnow
from mailbag.domain.delivery import Decision, Disabled, SendOutcome
from mailbag.domain.message import Message
from mailbag.domain.states import Action
from mailbag.providers.base import Provider
from mailbag.providers.kit import describe
from mailbag.templates import Catalog
from mailbag.worker.attempt import NO_CONTENTS, Sender, chunks
from mailbag.worker.config import PeriodicJob, WorkerConfig
from mailbag.worker.database import WorkerDatabase, Written
from mailbag.worker.failures import DB_ERRORS, Backoff
from mailbag.worker.leases import LeaseKeeper
from mailbag.worker.ledger import BACKLOG_FACTOR, Decided, Ledger
from mailbag.worker.report import Report
from mailbag.worker.supervisor import SideTasks, run_regularly
from mailbag.worker.writer import OutcomeWriter

FINALIZER = "mailbag-finalizer"


class Worker:
    def __init__(
        self,
        *,
        engine: AsyncEngine,
        provider: Provider,
        catalog: Catalog,
        config: WorkerConfig,
        clock: Clock = utcnow,
        rng: random.Random | None = None,
        listen_url: str | None = None,
        jobs: Sequence[PeriodicJob] = (),
    ) -> None:
        self.provider, self.config, self.clock = provider, config, clock
        self.listen_url, self.jobs = listen_url, list(jobs)
        self.log = log.get("mailbag.worker", worker_id=config.worker_id)
        self.database = WorkerDatabase(
            engine,
            worker_id=config.worker_id,
            provider=provider.name,
            lease=config.lease,
            timeout=config.db_timeout,
            clock=clock,
        )
        self.sender = Sender(provider, catalog, config, clock, rng or random.Random(), self.log)
        self.ledger = Ledger(config.concurrency)
        self.writer: OutcomeWriter[Decided, Written] = OutcomeWriter(
            self.database.finalize,
            self._written,
            # Never reached in practice (claiming stops at the backlog): a bound, not a goal.
            max_size=(BACKLOG_FACTOR + 1) * config.concurrency,
            backoff=config.db_backoff,
            retry_on=DB_ERRORS,
            log=self.log,
            name=FINALIZER,
        )
        self.side_tasks = SideTasks(self.log)
        self.send_tasks: set[asyncio.Task[None]] = set()
        self.wake = asyncio.Event()
        self.stopping = False
        self.paused_until = 0.0  # monotonic time until which claiming is paused
        self.db_backoff = Backoff(*config.db_backoff)
        self.disabled_backoff = Backoff(*config.disabled_backoff)
        self.last_sweep = 0.0
        self.report = Report(self.log, provider.name)

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatch until `stop` is set, then drain and return. May be called again after.

        Raises WorkerFailed, once drained, if a side task died."""
        self.stopping = False
        self.side_tasks = SideTasks(self.log)
        self.log.info(
            "worker_started",
            provider=self.provider.name,
            concurrency=self.config.concurrency,
            batch_size=self.config.batch_size,
        )
        async with self._side_tasks():
            loop = asyncio.get_running_loop()

            def wake_from_any_thread() -> None:
                loop.call_soon_threadsafe(self.wake.set)

            unsubscribe = wakeup.subscribe(wake_from_any_thread)
            try:
                while not stop.is_set() and not self.side_tasks.halted.is_set():
                    # Cleared before the round, not after: a NOTIFY or a freed slot that
                    # comes while this round runs must still cut the next wait short.
                    self.wake.clear()
                    self.ledger.slot_freed.clear()
                    if not await self._tick():
                        await self._wait_for_work(stop)
            finally:
                unsubscribe()
                await self._drain()
        self.log.info("worker_stopped", **self.report.stats)
        if self.side_tasks.failure is not None:
            raise self.side_tasks.failure

    @contextlib.asynccontextmanager
    async def _side_tasks(self) -> AsyncIterator[None]:
        """Start every side task, and stop them all after the drain (which needs the writer
        and the leases kept to the end)."""
        side = self.side_tasks
        keeper = LeaseKeeper(
            self.database.extend_leases,
            self.ledger.by_token,
            lease=self.config.lease,
            retry_on=DB_ERRORS,
            log=self.log,
        )
        async with keeper as leases:
            side.watch(leases)
            side.watch(self.writer.start())
            for job in self.jobs:
                side.start(job.name, run_regularly(job, self.clock, self.log))
            if self.listen_url is not None and self.database.can_listen():
                side.start(
                    "mailbag-listen", self.database.listen(self.listen_url, self.wake.set, self.log)
                )
            try:
                yield
            finally:
                await side.stop()

    async def _tick(self) -> bool:
        """One round of sweep and claim. True when a full batch was claimed (more is due)."""
        if time.monotonic() < self.paused_until:
            return False
        try:
            await self._maybe_sweep()
            free = self.ledger.free_slots()
            if free <= 0:
                return False
            limit = min(self.config.batch_size, free)
            started = time.perf_counter()
            claim = await self.database.claim(limit)
            metrics.CLAIM_SECONDS.observe(time.perf_counter() - started)
            metrics.CLAIM_BATCH.observe(len(claim.messages))
            self.db_backoff.reset()
        except DB_ERRORS as exc:
            delay = self.db_backoff.next()
            self.log.warning("database_unavailable", error=describe(exc), retry_in=delay)
            self.paused_until = time.monotonic() + delay
            return False
        if claim.messages:
            self.report.stats["claimed"] += len(claim.messages)
            self._dispatch(claim.token, claim.messages, claim.contents)
        return len(claim.messages) == limit

    async def _maybe_sweep(self) -> None:
        # Our own rows whose outcome is known but not yet written must not be swept to
        # `unknown`: sweep only when everything we know has been written.
        if self.ledger.unwritten or time.monotonic() - self.last_sweep < self.config.sweep_every:
            return
        swept = await self.database.sweep()
        self.last_sweep = time.monotonic()
        if swept:
            self.report.swept(swept)
            again = await self.database.expired_again([c.message.id for c in swept])
            self.report.expired_again(len(again))

    async def _wait_for_work(self, stop: asyncio.Event) -> None:
        """Sleep until woken (NOTIFY, an in-process enqueue, a freed slot) or the poll is due."""
        timeout = self.config.poll_interval
        pause = self.paused_until - time.monotonic()
        if pause > 0:
            timeout = pause
        waiters = [
            asyncio.ensure_future(stop.wait()),
            asyncio.ensure_future(self.side_tasks.halted.wait()),
        ]
        if pause <= 0:
            woken_by = self.ledger.slot_freed if self.ledger.full else self.wake
            waiters.append(asyncio.ensure_future(woken_by.wait()))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    def _dispatch(
        self,
        token: uuid.UUID,
        messages: Sequence[Message],
        contents: Mapping[str, bytes] = NO_CONTENTS,
    ) -> None:
        self.ledger.claimed(token, messages)
        for chunk in chunks(messages, self.provider.max_batch_size):
            task = asyncio.create_task(self.sender.attempt(chunk, self, contents))
            self.send_tasks.add(task)
            task.add_done_callback(self.send_tasks.discard)

    # --- what the send tasks report (attempt.Progress) -----------------------------------

    def start(self, messages: Sequence[Message]) -> bool:
        if self.stopping:  # claimed but never started: hand back, no attempt spent
            return False
        self.ledger.sending(messages)
        return True

    def decided(self, message: Message, outcome: SendOutcome | None, decision: Decision) -> None:
        if isinstance(outcome, Disabled) and not self.stopping:
            delay = self.disabled_backoff.next()
            self.paused_until = max(self.paused_until, time.monotonic() + delay)
            self.log.warning("provider_disabled", reason=outcome.reason, pause_seconds=delay)
        elif decision.action is Action.MARK_SENT:
            self.disabled_backoff.reset()
        self.writer.put(self.ledger.decided(message, decision))

    def _written(self, batch: list[Decided], results: Written) -> None:
        """The writer wrote `batch`: forget it, and tell what became of it."""
        self.ledger.written(batch)
        self.report.written(results)

    # --- shutdown ------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Stop claiming; finish, finalize or release everything this worker holds.

        What still cannot be written stays `processing`, its lease no longer renewed, until
        a sweep makes it `unknown`: most of those sends happened, and none is resent
        blindly (evidence or an operator decides)."""
        self.stopping = True
        if self.send_tasks:
            _, late = await asyncio.wait(set(self.send_tasks), timeout=self.config.shutdown_grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        # Claimed messages whose send never began (none should remain, but be sure).
        for message in self.ledger.unstarted():
            outcome = Disabled("worker shutting down")
            self.decided(message, outcome, self.sender.decide(message, outcome))
        if not await self.writer.drain(max(self.config.shutdown_grace, 5.0)):
            self.log.error("shutdown_with_unwritten_outcomes", count=self.ledger.unwritten)
