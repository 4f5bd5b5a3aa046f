"""The worker's loop: sweep -> claim -> dispatch -> wait, until told to stop; then drain.

Each claimed chunk is sent by its own task (`Sender.attempt`); the ledger counts what is
held and the free slots; decisions go to the outcome writer, which writes them in batches;
the lease keeper extends everything held. Those two are essential: one that dies stops the
worker as SIGTERM would, and `run` raises WorkerFailed once drained. The listener and the
periodic jobs (the scheduler, hook deliveries) are optional: one that fails is logged,
counted and started again after a backoff, and mail goes on (supervisor.py).

Under PROVIDER_RATE (`rate_limit`) each claim takes its send slots from the fleet's schedule
in one statement (worker/rate.py); each chunk leaves at its last message's slot, a claim
holds at most HORIZON_SECONDS' worth of the rate, and claiming waits while the fleet's
schedule runs further ahead than that. A throttled send is released (no attempt spent)
and lowers the fleet's rate; without PROVIDER_RATE it pauses this worker's claims instead.

Under DOMAIN_SHAPING (worker/shaping.py) a recipient domain's deferral (a throttle naming
the domain too) slows that domain for the fleet, and nothing else; a claim's messages of a
slowed domain whose slot is not due are handed back unsent (no attempt spent), due at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag import log, metrics, wakeup
from mailbag.clock import Clock, utcnow
from mailbag.domain import rate
from mailbag.domain.delivery import Decision, Disabled, SendOutcome, Throttled
from mailbag.domain.message import Message
from mailbag.domain.states import Action
from mailbag.providers.base import Provider
from mailbag.providers.kit import describe
from mailbag.store.plan import Plan
from mailbag.templates import Catalog
from mailbag.templates.book import book_of
from mailbag.worker.attempt import NO_CONTENTS, Sender, chunks
from mailbag.worker.config import PeriodicJob, WorkerConfig
from mailbag.worker.database import Claimed, WorkerDatabase, Written
from mailbag.worker.failures import DB_ERRORS, Backoff
from mailbag.worker.fleet import Fleet
from mailbag.worker.leases import LeaseKeeper
from mailbag.worker.ledger import BACKLOG_FACTOR, Decided, Ledger
from mailbag.worker.rate import FleetRate, Slots
from mailbag.worker.report import Report
from mailbag.worker.shaping import DomainShaper
from mailbag.worker.supervisor import SideTasks, run_regularly
from mailbag.worker.writer import OutcomeWriter

FINALIZER = "mailbag-finalizer"
# Without PROVIDER_RATE, a throttled worker pauses its claims this long (doubling, reset by
# a send), or for the provider's retry-after hint when that is longer.
THROTTLE_BACKOFF = (1.0, 60.0)


class Worker:
    def __init__(
        self,
        *,
        engine: AsyncEngine,
        provider: Provider | None = None,
        fleet: Fleet | None = None,
        catalog: Catalog,
        config: WorkerConfig,
        clock: Clock = utcnow,
        rng: random.Random | None = None,
        listen_url: str | None = None,
        jobs: Sequence[PeriodicJob] = (),
        rate_limit: rate.RateLimit | None = None,
    ) -> None:
        if fleet is None:
            if provider is None:
                raise TypeError("a worker needs a provider or a fleet of them")
            fleet = Fleet.single(provider, breaker=config.provider_breaker)
        self.fleet, self.config, self.clock = fleet, config, clock
        # The first of the fleet: the one for a deployment with only PROVIDER set, and the
        # name the fleet's shared rate (PROVIDER_RATE) and its defaults go by.
        first, self.provider = next(iter(fleet.members.items()))
        self.listen_url, self.jobs = listen_url, list(jobs)
        self.log = log.get("mailbag.worker", worker_id=config.worker_id)
        self.database = WorkerDatabase(
            engine,
            worker_id=config.worker_id,
            provider=first,
            lease=config.lease,
            timeout=config.db_timeout,
            clock=clock,
            book=book_of(catalog),
        )
        self.sender = Sender(
            fleet, self.database.book, config, clock, rng or random.Random(), self.log
        )
        self.fleet_rate = (
            FleetRate(
                engine,
                provider=first,
                limit=rate_limit,
                timeout=config.db_timeout,
                log=self.log,
            )
            if rate_limit is not None
            else None
        )
        self.shaping = (
            DomainShaper(
                engine,
                config.domain_shaping,
                poll_interval=config.poll_interval,
                timeout=config.db_timeout,
                clock=clock,
                log=self.log,
            )
            if config.domain_shaping is not None
            else None
        )
        self.ledger = Ledger(config.concurrency, config.max_bytes_in_flight)
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
        self.throttle_backoff = Backoff(*THROTTLE_BACKOFF)
        self.last_sweep = 0.0
        self.report = Report(self.log, first)

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatch until `stop` is set, then drain and return. May be called again after.

        Raises WorkerFailed, once drained, if a side task died."""
        self.stopping = False
        self.side_tasks = SideTasks(self.log)
        self.log.info(
            "worker_started",
            providers=sorted(self.fleet.members),
            concurrency=self.config.concurrency,
            batch_size=self.config.batch_size,
            provider_rate=self.fleet_rate.limit.per_second if self.fleet_rate else None,
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
            # Optional parts (supervisor.py): a failure restarts them; mail goes on.
            for job in self.jobs:
                side.start_optional(
                    job.name, functools.partial(run_regularly, job, self.clock, self.log)
                )
            if self.listen_url is not None and self.database.can_listen():
                side.start_optional(
                    "mailbag-listen",
                    functools.partial(
                        self.database.listen,
                        self.listen_url,
                        self._notified,
                        self.log,
                        self.fleet.listening,
                    ),
                )
            try:
                yield
            finally:
                await side.stop()

    def _notified(self, payload: str | None) -> None:
        """LISTEN heard an enqueue, a change of the fleet's state, or (None) reconnected."""
        self.fleet.heard(payload)
        self.wake.set()

    async def _tick(self) -> bool:
        """One round of sweep and claim. True when a full batch was claimed (more is due)."""
        if time.monotonic() < self.paused_until:
            return False
        try:
            await self._maybe_sweep()
            free = self.ledger.free_slots()
            if free <= 0:
                return False
            if self.fleet.fleet_paused:  # an operator paused all sending: claim nothing
                await self._sync_fleet(every=self.config.poll_interval)  # until resumed
                if self.fleet.fleet_paused:
                    return False
            limit = min(self.config.batch_size, free)
            if self.fleet_rate is not None:
                limit = min(limit, rate.claim_limit(self.fleet_rate.in_force))
            if released := await self.database.release_unconfirmed():
                self._released_unconfirmed(released)
            started = time.perf_counter()
            claim = await self._claim(limit)
            metrics.CLAIM_SECONDS.observe(time.perf_counter() - started)
            metrics.CLAIM_BATCH.observe(len(claim.messages))
            self.db_backoff.reset()
        except DB_ERRORS as exc:
            self._database_unavailable(exc)
            return False
        if not claim.messages:
            return False
        self.report.stats["claimed"] += len(claim.messages)
        if claim.over:
            self._no_room(claim.token, claim.over)
        messages = claim.messages
        if self.shaping is not None:
            try:
                messages = await self._shaped(claim.token, messages)
            except DB_ERRORS as exc:
                self._hand_back(claim.token, messages, exc)
                return False
        slots = None
        if self.fleet_rate is not None and messages:
            try:
                slots = await self.fleet_rate.reserve(len(messages))
            except DB_ERRORS as exc:
                self._hand_back(claim.token, messages, exc)
                return False
            # Claim again once the fleet's schedule runs less than a horizon ahead.
            self.paused_until = max(self.paused_until, slots.schedule_end - rate.HORIZON_SECONDS)
        self._dispatch(claim.token, messages, claim.contents, slots)
        return len(claim.messages) == limit

    async def _shaped(self, token: uuid.UUID, messages: list[Message]) -> list[Message]:
        """The claimed messages that go now; those of a shaped recipient domain whose slot
        is not yet due are handed back unsent, due again then (no attempt spent)."""
        assert self.shaping is not None
        going, waiting = await self.shaping.admit(messages)
        if waiting:
            self.ledger.claimed(token, [message for message, _, _ in waiting])
            for message, why, until in waiting:
                decision = self.sender.wait(message, why, until)
                self.writer.put(self.ledger.decided(message, decision))
        return going

    def _no_room(self, token: uuid.UUID, messages: Sequence[Message]) -> None:
        """Claimed, but their attachments would take this worker past MAX_BYTES_IN_FLIGHT:
        back unsent (another worker may take them), and no claim until a held message is
        decided."""
        self.ledger.claimed(token, messages)
        unsent = Decision(Action.RELEASE, error="waiting for room: MAX_BYTES_IN_FLIGHT")
        for message in messages:
            self.writer.put(self.ledger.decided(message, unsent))
        self.ledger.bytes_refused = True
        self.report.stats["handed_back_for_bytes"] += len(messages)

    def _hand_back(self, token: uuid.UUID, messages: Sequence[Message], exc: Exception) -> None:
        """Claimed, but no slot to send them in (the database failed): back unsent."""
        self.ledger.claimed(token, messages)
        unsent = Decision(Action.RELEASE, error=f"no send slot: {describe(exc)}")
        for message in messages:
            self.writer.put(self.ledger.decided(message, unsent))
        self._database_unavailable(exc)

    def _released_unconfirmed(self, count: int) -> None:
        self.report.stats["released_unconfirmed"] += count
        metrics.UNCONFIRMED_CLAIMS_RELEASED.inc(count)
        self.log.warning("unconfirmed_claim_released", count=count)

    def _database_unavailable(self, exc: BaseException) -> None:
        delay = self.db_backoff.next()
        self.log.warning("database_unavailable", error=describe(exc), retry_in=delay)
        self.paused_until = time.monotonic() + delay

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
        slots: Slots | None = None,
    ) -> None:
        """Send `messages` in chunks through their providers, each no earlier than its last
        message's slot; a message none of whose providers is available waits (no attempt)."""
        self.ledger.claimed(token, messages)
        now = self.clock()
        by_provider: dict[str, list[Message]] = {}
        if (sole := self.fleet.sole(now)) is not None:
            by_provider[sole] = list(messages)
        else:
            for message in messages:
                name = self.fleet.choose(message, now)
                if name is None:
                    self.decided(message, None, self.sender.waiting(message))
                else:
                    by_provider.setdefault(name, []).append(message)
        sent = 0
        for name, group in by_provider.items():
            size = self.fleet.members[name].max_batch_size
            if slots is not None:
                size = min(size, rate.chunk_limit(slots.grant.rate))
            for chunk in chunks(group, size):
                sent += len(chunk)
                slot = slots.slot(sent - 1) if slots is not None else None
                work = self.sender.attempt(chunk, self, contents, slot=slot, provider=name)
                task = asyncio.create_task(work)
                self.send_tasks.add(task)
                task.add_done_callback(self.send_tasks.discard)

    # --- what the send tasks report (attempt.Progress) -----------------------------------

    def start(self, messages: Sequence[Message]) -> bool:
        if self.stopping:  # claimed but never started: hand back, no attempt spent
            return False
        self.ledger.sending(messages)
        return True

    def decided(self, message: Message, outcome: SendOutcome | None, decision: Decision) -> None:
        # A recipient domain's deferral slows that domain (a throttle naming it included:
        # it is the domain's, not the provider's).
        by_domain = self.shaping is not None and self.shaping.deferred(message, outcome)
        # One provider: its being disabled pauses this worker's claims (with several, its
        # breaker keeps messages from it while the others send).
        if isinstance(outcome, Disabled) and not self.stopping and self.fleet.alone:
            # One pause per burst, as for throttles: the other sends of a batch that found
            # the provider disabled were made before the pause, and must not each double it.
            if time.monotonic() >= self.paused_until:
                delay = self.disabled_backoff.next()
                self.paused_until = time.monotonic() + delay
                self.log.warning("provider_disabled", reason=outcome.reason, pause_seconds=delay)
        elif isinstance(outcome, Throttled) and not by_domain:
            self._throttled(outcome)
        elif decision.action is Action.MARK_SENT:
            self.disabled_backoff.reset()
            self.throttle_backoff.reset()
        self.writer.put(self.ledger.decided(message, decision))

    def _throttled(self, outcome: Throttled) -> None:
        """The provider throttled a send: slow the fleet down (or, without PROVIDER_RATE,
        this worker)."""
        if self.fleet_rate is not None:
            if self.fleet_rate.report_throttle(outcome.retry_after):
                self.log.warning("provider_throttled", error=outcome.error)
            return
        # One pause per burst: the other sends of the burst were made before it.
        if self.stopping or time.monotonic() < self.paused_until:
            return
        delay = self.throttle_backoff.next()
        if outcome.retry_after is not None:
            delay = max(delay, outcome.retry_after.total_seconds())
        self.paused_until = time.monotonic() + delay
        self.log.warning("provider_throttled", error=outcome.error, pause_seconds=delay)

    def _written(self, batch: list[Decided], results: Written) -> None:
        """The writer wrote `batch`: forget it, and tell what became of it."""
        self.ledger.written(batch)
        self.report.written(results)

    # --- shutdown ------------------------------------------------------------------------

    async def _claim(self, limit: int) -> Claimed:
        """A claim as the fleet's pauses let it, with the fleet's state exchanged in its
        transaction when that is due (at most once a poll interval: breakers and pauses)."""
        exchange = self.fleet.exchange(now=self.clock(), every=self.config.poll_interval)
        before = _in_turn(exchange, self.shaping.refresh() if self.shaping else None)
        try:
            claim = await self.database.claim(limit, self.fleet, before, self.ledger.room())
        except DB_ERRORS as exc:
            if exchange is not None:
                self.fleet.not_exchanged(exc, self.log)
            raise
        if exchange is not None:
            self.fleet.exchanged(self.log)
        return claim

    async def _sync_fleet(self, *, every: float) -> None:
        await self.fleet.sync(
            self.database.db.engine,
            now=self.clock(),
            every=every,
            db_timeout=self.config.db_timeout,
            log=self.log,
        )

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
        if self.fleet_rate is not None:
            await self.fleet_rate.aclose()
        if self.shaping is not None:
            await self.shaping.aclose()
        if not await self.writer.drain(max(self.config.shutdown_grace, 5.0)):
            self.log.error("shutdown_with_unwritten_outcomes", count=self.ledger.unwritten)
        await self._sync_fleet(every=0.0)  # what its last sends taught it, for the others
        try:
            if released := await self.database.release_unconfirmed():
                self._released_unconfirmed(released)
        except DB_ERRORS as exc:  # the sweep makes them `unknown` once their lease runs out
            self.log.warning("unconfirmed_claim_not_released", error=describe(exc))


def _in_turn(*plans: Plan[None] | None) -> Plan[None] | None:
    """The plans given, one after the other in one transaction; None when none is."""
    due = [plan for plan in plans if plan is not None]
    if len(due) <= 1:
        return due[0] if due else None
    return _chained(due)


def _chained(plans: list[Plan[None]]) -> Plan[None]:
    for plan in plans:
        yield from plan
