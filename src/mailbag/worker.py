"""The dispatcher: sweep -> claim -> render -> send -> finalize, safe with any number of replicas.

One asyncio task runs the loop; each claimed batch is sent by its own task (at most
CONCURRENCY emails are claimed and unfinished at once); finalizations are written in
batches by one writer task, and a keeper task extends the leases of everything in flight.
No database transaction is ever open while a provider call is in flight.

Failure handling, in short:
- a database error anywhere backs the loop off (1 s doubling to 30 s) and it resumes;
  outcomes that could not be written are kept and written when the database is back. A
  database that does not answer within DATABASE_TIMEOUT_SECONDS counts as an error;
- the helper tasks (finalizer, lease keeper, listener, periodic jobs) run as long as the
  worker does. If one dies (a bug, not a database error), the worker stops as on SIGTERM
  (drains, writes what it can, releases what it had not started, stops renewing leases)
  and `run` raises WorkerFailed, so the process exits non-zero and its supervisor
  restarts it: never a half-alive worker whose leases outlive its finalizer;
- a provider that reports itself disabled gets its messages released (no attempt spent)
  and the whole worker pauses claiming for a while;
- SIGTERM/SIGINT: stop claiming, let sends in flight finish within the grace period,
  finalize them, release what had not started, and return.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag import log, metrics, wakeup
from mailbag.clock import Clock, utcnow
from mailbag.compose import OutgoingEmail, compose
from mailbag.domain.delivery import (
    Accepted,
    Ambiguous,
    Attempt,
    Decision,
    Disabled,
    Rejected,
    decide,
)
from mailbag.domain.message import Message
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.states import Action
from mailbag.domain.verification import Tokens
from mailbag.providers.base import Provider
from mailbag.settings import Settings
from mailbag.store import outbox as store
from mailbag.store import verifications as verification_store
from mailbag.store.database import DEFAULT_TIMEOUT, Dialect, dialect_of, within
from mailbag.store.plan import run_async
from mailbag.templates import Catalog, TemplateError

DB_ERRORS = (SQLAlchemyError, OSError)  # OSError includes TimeoutError (DatabaseTimeout)
BACKLOG_FACTOR = 4
FINALIZER = "mailbag-finalizer"


class WorkerFailed(RuntimeError):
    """A helper task died and the worker stopped: restart the process."""


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: str
    batch_size: int = 100
    concurrency: int = 32
    poll_interval: float = 1.0
    lease: timedelta = timedelta(seconds=120)
    shutdown_grace: float = 30.0
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    from_email: str = "mailbag@localhost"
    from_name: str | None = None
    message_id_domain: str = "localhost"
    sweep_every: float = 1.0
    db_backoff: tuple[float, float] = (1.0, 30.0)
    db_timeout: float = DEFAULT_TIMEOUT  # seconds one database round may take
    disabled_backoff: tuple[float, float] = (5.0, 300.0)
    # Derives verification tokens at render time; without it a verification email fails.
    tokens: Tokens | None = None

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> WorkerConfig:
        values: dict[str, Any] = {
            "worker_id": settings.worker_id,
            "batch_size": settings.batch_size,
            "concurrency": settings.concurrency,
            "poll_interval": settings.poll_interval,
            "lease": settings.lease,
            "shutdown_grace": settings.shutdown_grace,
            "policy": settings.retry_policy,
            "from_email": settings.from_email,
            "from_name": settings.from_name,
            "message_id_domain": settings.message_id_host,
            "db_timeout": settings.database_timeout_seconds,
            # Raises MissingSecretKey: a worker without the key refuses to start.
            "tokens": settings.verification_tokens,
        }
        values.update(overrides)
        return cls(**values)


@dataclass(frozen=True)
class PeriodicJob:
    name: str
    every: float  # seconds
    run: Callable[[datetime], Awaitable[Mapping[str, int]]]


class Backoff:
    """Exponential delays between a first step and a cap, reset by a success."""

    def __init__(self, first: float, cap: float) -> None:
        self.first, self.cap, self.failures = first, cap, 0

    def next(self) -> float:
        delay = min(self.cap, self.first * float(2**self.failures))
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


@dataclass
class InFlight:
    token: uuid.UUID
    message: Message
    started: bool = False
    decided: bool = False


@dataclass(frozen=True)
class Outcome:
    """A decision waiting to be written, with what the log line needs."""

    token: uuid.UUID
    message: Message
    decision: Decision


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
        self.engine = engine
        self.dialect: Dialect = dialect_of(engine.url)
        self.provider = provider
        self.catalog = catalog
        self.config = config
        self.clock = clock
        self.rng = rng or random.Random()
        self.listen_url = listen_url
        self.jobs = list(jobs)
        self.log = log.get("mailbag.worker", worker_id=config.worker_id)

        self.in_flight: dict[uuid.UUID, InFlight] = {}
        self.send_tasks: set[asyncio.Task[None]] = set()
        self.outcomes: asyncio.Queue[Outcome] = asyncio.Queue()
        self.writing: list[Outcome] = []  # taken from the queue, not yet committed
        self.unwritten = 0  # outcomes queued or being written
        self.all_written = asyncio.Event()
        self.wake = asyncio.Event()
        self.slot_freed = asyncio.Event()
        self.stopping = False
        self.helpers: dict[str, asyncio.Task[None]] = {}
        self.halted = asyncio.Event()  # a helper died
        self.failure: WorkerFailed | None = None
        self.paused_until = 0.0  # monotonic time until which claiming is paused
        self.db_backoff = Backoff(*config.db_backoff)
        self.disabled_backoff = Backoff(*config.disabled_backoff)
        self.last_sweep = 0.0
        self.stats: dict[str, int] = defaultdict(int)

    # --- the loop ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatch until `stop` is set, then drain and return. May be called again after.

        Raises WorkerFailed, once drained, if a helper task died."""
        self.stopping = False
        self.failure = None
        self.halted.clear()
        self.log.info(
            "worker_started",
            provider=self.provider.name,
            concurrency=self.config.concurrency,
            batch_size=self.config.batch_size,
        )
        self._start_helpers()
        loop = asyncio.get_running_loop()

        def wake_from_any_thread() -> None:
            loop.call_soon_threadsafe(self.wake.set)

        unsubscribe = wakeup.subscribe(wake_from_any_thread)
        try:
            while not stop.is_set() and not self.halted.is_set():
                # Cleared before the round, not after: a NOTIFY or a freed slot that comes
                # while this round runs must still cut the next wait short.
                self.wake.clear()
                self.slot_freed.clear()
                full_batch = await self._tick()
                if not full_batch:
                    await self._wait_for_work(stop)
        finally:
            unsubscribe()
            await self._drain()
            await self._stop_helpers()
            self.log.info("worker_stopped", **self.stats)
        if self.failure is not None:
            raise self.failure

    def _start_helpers(self) -> None:
        """The side tasks, started in one place and watched by `_helper_ended`."""
        work = {job.name: self._run_regularly(job) for job in self.jobs}
        work[FINALIZER] = self._write_outcomes()
        work["mailbag-leases"] = self._keep_leases()
        if self.dialect == "postgresql" and self.listen_url is not None:
            work["mailbag-listen"] = self._listen(self.listen_url)
        for name, coroutine in work.items():
            task = asyncio.create_task(coroutine, name=name)
            task.add_done_callback(self._helper_ended)
            self.helpers[name] = task

    def _helper_ended(self, task: asyncio.Task[None]) -> None:
        """Each helper runs as long as the worker: its end, however it came, stops the worker
        (a finalizer that died would leave the lease keeper renewing messages whose outcome
        is never written)."""
        if self.failure is not None:
            return
        error = None if task.cancelled() else task.exception()
        what = "cancelled" if task.cancelled() else _describe(error) if error else "returned"
        self.log.error("worker_helper_died", helper=task.get_name(), error=what, exc_info=error)
        self.failure = WorkerFailed(
            f"the worker's {task.get_name()} task died ({what}); "
            "the worker drained and stopped: restart it"
        )
        self.failure.__cause__ = error
        self.halted.set()

    async def _stop_helpers(self) -> None:
        helpers, self.helpers = list(self.helpers.values()), {}
        for task in helpers:
            task.remove_done_callback(self._helper_ended)  # ended on purpose
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)

    async def _tick(self) -> bool:
        """One round of sweep and claim. True when a full batch was claimed (more is due)."""
        if time.monotonic() < self.paused_until:
            return False
        try:
            await within(self.config.db_timeout, self._maybe_sweep())
            # Decided messages waiting for their finalize take no slot, but when the
            # database falls behind that much, stop claiming until it catches up.
            backlog = self.unwritten >= BACKLOG_FACTOR * self.config.concurrency
            free = 0 if backlog else self.config.concurrency - self.sending
            if free <= 0:
                return False
            limit = min(self.config.batch_size, free)
            started = time.perf_counter()
            # A claim given up on here, whose COMMIT had already reached the server, leaves
            # rows nobody sends: the sweep makes them `unknown`, as for a connection lost
            # during that COMMIT. Never a duplicate; the window is one round trip.
            claim = await within(self.config.db_timeout, self._claim(limit))
            metrics.CLAIM_SECONDS.observe(time.perf_counter() - started)
            metrics.CLAIM_BATCH.observe(len(claim.messages))
            self.db_backoff.reset()
        except DB_ERRORS as exc:
            delay = self.db_backoff.next()
            self.log.warning("database_unavailable", error=_describe(exc), retry_in=delay)
            self.paused_until = time.monotonic() + delay
            return False
        if claim.messages:
            self.stats["claimed"] += len(claim.messages)
            self._dispatch(claim)
        return len(claim.messages) == limit

    async def _claim(self, limit: int) -> store.Claim:
        async with self.engine.begin() as conn:
            return await run_async(
                conn,
                store.claim(
                    self.dialect,
                    worker_id=self.config.worker_id,
                    now=self.clock(),
                    lease=self.config.lease,
                    limit=limit,
                ),
            )

    async def _wait_for_work(self, stop: asyncio.Event) -> None:
        """Sleep until woken (NOTIFY, an in-process enqueue, a freed slot) or the poll is due."""
        timeout = self.config.poll_interval
        pause = self.paused_until - time.monotonic()
        if pause > 0:
            timeout = pause
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.halted.wait())]
        if pause <= 0:
            full = self.sending >= self.config.concurrency
            waiters.append(asyncio.ensure_future((self.slot_freed if full else self.wake).wait()))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _maybe_sweep(self) -> None:
        # Our own rows whose outcome is known but not yet written must not be swept to
        # `unknown`: sweep only when everything we know has been written.
        if self.unwritten or time.monotonic() - self.last_sweep < self.config.sweep_every:
            return
        async with self.engine.begin() as conn:
            swept = await run_async(
                conn,
                store.sweep_expired(
                    self.dialect,
                    now=self.clock(),
                    actor=self.config.worker_id,
                ),
            )
        self.last_sweep = time.monotonic()
        if swept:
            metrics.LEASE_EXPIRATIONS.inc(len(swept))
            async with self.engine.connect() as conn:
                again = await run_async(conn, store.expired_before([c.message.id for c in swept]))
            metrics.LEASE_EXPIRED_AGAIN.inc(len(again))
        for changed in swept:
            self.stats["swept"] += 1
            self.log.warning(
                "lease_expired",
                message_id=str(changed.message.id),
                attempt=changed.message.attempt_count,
                claimed_by=changed.message.claimed_by,
                transition="processing->unknown",
            )

    # --- sending --------------------------------------------------------------------------

    @property
    def sending(self) -> int:
        """Messages claimed and not yet decided: what CONCURRENCY bounds. Decided ones only
        wait for their finalize (their leases are still kept) and need no slot."""
        return len(self.in_flight) - self.unwritten

    def _dispatch(self, claim: store.Claim) -> None:
        for message in claim.messages:
            self.in_flight[message.id] = InFlight(claim.token, message)
        # A retry under an ambiguous send's idempotency key must go alone: a batch call
        # carries no per-email key, so the provider could not deduplicate it.
        keyed = [[m] for m in claim.messages if m.ambiguous_since is not None]
        rest = [m for m in claim.messages if m.ambiguous_since is None]
        size = max(1, self.provider.max_batch_size)
        for chunk in keyed + [rest[i : i + size] for i in range(0, len(rest), size)]:
            task = asyncio.create_task(self._send_chunk(claim.token, chunk))
            self.send_tasks.add(task)
            task.add_done_callback(self.send_tasks.discard)

    async def _send_chunk(self, token: uuid.UUID, messages: Sequence[Message]) -> None:
        now = self.clock()
        ready: list[tuple[Message, OutgoingEmail]] = []
        for message in messages:
            try:
                email = compose(
                    message,
                    self.catalog,
                    default_from_email=self.config.from_email,
                    default_from_name=self.config.from_name,
                    message_id_domain=self.config.message_id_domain,
                    now=now,
                    secrets=self.config.tokens.secrets_for if self.config.tokens else None,
                )
            except TemplateError as exc:
                self._decide(token, message, Rejected(str(exc)))
            else:
                ready.append((message, email))
        if not ready:
            return
        if self.stopping:  # claimed but never started: hand back, no attempt spent
            for message, _ in ready:
                self._decide(token, message, Disabled("worker shutting down before the send"))
            return
        for message, _ in ready:
            self.in_flight[message.id].started = True
        emails = [email for _, email in ready]
        started = time.perf_counter()
        try:
            if len(emails) == 1:
                outcomes = [await self.provider.send(emails[0])]
            else:
                outcomes = await self.provider.send_batch(emails)
            metrics.PROVIDER_SECONDS.labels(self.provider.name).observe(
                time.perf_counter() - started
            )
        except asyncio.CancelledError:
            # The grace period ran out mid-send: whether it left is unknown.
            for message, _ in ready:
                self._decide(
                    token, message, Ambiguous("send interrupted by shutdown", keyed=len(ready) == 1)
                )
            raise
        except Exception as exc:  # a provider bug: it may have sent, so never resend blindly
            self.log.exception("provider_crashed", provider=self.provider.name)
            outcomes = [Ambiguous(f"provider raised {_describe(exc)}", keyed=False)] * len(emails)
        for (message, _), outcome in zip(ready, outcomes, strict=True):
            self._decide(token, message, outcome)

    def _decide(self, token: uuid.UUID, message: Message, outcome: Any) -> None:
        if not isinstance(outcome, Accepted):
            metrics.PROVIDER_ERRORS.labels(self.provider.name, type(outcome).__name__.lower()).inc()
        decision = decide(
            outcome,
            Attempt(
                message.attempt,
                message.max_attempts,
                message.claimed_at or self.clock(),
                message.ambiguous_since,
            ),
            now=self.clock(),
            policy=self.config.policy,
            key_window=self.provider.idempotency_window,
            rng=self.rng,
        )
        if isinstance(outcome, Disabled) and not self.stopping:
            delay = self.disabled_backoff.next()
            self.paused_until = max(self.paused_until, time.monotonic() + delay)
            self.log.warning("provider_disabled", reason=outcome.reason, pause_seconds=delay)
        elif decision.action is Action.MARK_SENT:
            self.disabled_backoff.reset()
        flight = self.in_flight.get(message.id)
        if flight is not None:
            flight.decided = True
        self.unwritten += 1
        self.slot_freed.set()  # the send is over: its slot can take the next message
        self.all_written.clear()
        self.outcomes.put_nowait(Outcome(token, message, decision))

    # --- writing outcomes ----------------------------------------------------------------------

    async def _write_outcomes(self) -> None:
        """Write decisions in batches: whatever accumulated while the last write ran."""
        while True:
            batch = [await self.outcomes.get()]
            while not self.outcomes.empty():
                batch.append(self.outcomes.get_nowait())
            self.writing = batch  # if this task dies, the drain writes these again
            await self._finalize(batch)

    async def _finalize(self, batch: list[Outcome]) -> None:
        by_token: dict[uuid.UUID, list[Outcome]] = defaultdict(list)
        for item in batch:
            by_token[item.token].append(item)
        backoff = Backoff(*self.config.db_backoff)
        while True:
            try:
                # Given up on after its COMMIT left, the retry finds the rows finalized
                # and reports them stale: noisy, never wrong.
                results = await within(self.config.db_timeout, self._write_batch(by_token))
                break
            except DB_ERRORS as exc:
                # The send happened; its outcome must not be lost. Keep it and try again.
                delay = backoff.next()
                self.log.warning(
                    "finalize_failed", error=_describe(exc), retry_in=delay, pending=len(batch)
                )
                await asyncio.sleep(delay)
        self.writing = []
        for item in batch:
            self.in_flight.pop(item.message.id, None)
        self.unwritten -= len(batch)
        if not self.unwritten:
            self.all_written.set()
        for items, result in results:
            self._log_finalized(items, result)

    async def _write_batch(
        self, by_token: Mapping[uuid.UUID, list[Outcome]]
    ) -> list[tuple[list[Outcome], store.Finalized]]:
        async with self.engine.begin() as conn:
            now = self.clock()
            results = []
            for token, items in by_token.items():
                finalized = await run_async(
                    conn,
                    store.finalize(
                        self.dialect,
                        token=token,
                        outcomes=[_finalization(i) for i in items],
                        now=now,
                        actor=self.config.worker_id,
                        provider=self.provider.name,
                    ),
                )
                results.append((items, finalized))
                # Verifications follow their email in this same transaction.
                await run_async(
                    conn,
                    verification_store.follow_messages(
                        self.dialect,
                        finalized.changed,
                        now=now,
                        actor=self.config.worker_id,
                    ),
                )
        return results

    def _log_finalized(self, items: Iterable[Outcome], result: store.Finalized) -> None:
        stale = set(result.stale)
        for item in items:
            decision = item.decision
            if item.message.id in stale:
                self.stats["stale"] += 1
                metrics.STALE_FINALIZES.inc()
                # Someone else owns this row now (our lease expired and it was swept or
                # re-claimed): record what we knew, loudly, and change nothing.
                self.log.error(
                    "stale_finalize",
                    message_id=str(item.message.id),
                    attempt=item.message.attempt,
                    outcome=decision.action.value,
                    provider_message_id=decision.provider_message_id,
                    error=decision.error,
                )
                continue
            self.stats[decision.action.value] += 1
        per_message_lines = log.enabled(logging.INFO)
        for changed in result.changed:
            counter = metrics.OUTCOME_COUNTERS.get(changed.message.status)
            if counter is not None:
                counter.labels(self.provider.name, changed.message.template_name).inc()
            if not per_message_lines:
                continue
            self.log.info(
                "transition",
                message_id=str(changed.message.id),
                attempt=changed.message.attempt_count,
                transition=f"{changed.from_status.value}->{changed.message.status}",
                provider_message_id=changed.message.provider_message_id,
                error=changed.message.last_error if changed.message.status != "sent" else None,
            )

    # --- leases, wake-ups, shutdown ------------------------------------------------------------

    async def _keep_leases(self) -> None:
        """Extend the lease of every message still in flight, a few times per lease."""
        period = max(self.config.lease.total_seconds() / 3, 0.05)
        while True:
            await asyncio.sleep(period)
            by_token: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
            for message_id, flight in list(self.in_flight.items()):
                by_token[flight.token].append(message_id)
            if not by_token:
                continue
            try:
                await within(self.config.db_timeout, self._extend_leases(by_token))
            except DB_ERRORS as exc:
                self.log.warning("lease_extension_failed", error=_describe(exc))

    async def _extend_leases(self, by_token: Mapping[uuid.UUID, list[uuid.UUID]]) -> None:
        async with self.engine.begin() as conn:
            for token, ids in by_token.items():
                await run_async(
                    conn,
                    store.extend_lease(
                        self.dialect,
                        token=token,
                        ids=ids,
                        now=self.clock(),
                        lease=self.config.lease,
                    ),
                )

    async def _run_regularly(self, job: PeriodicJob) -> None:
        """A job the entry point hands in (reconciliation), every so often; its database
        errors are logged and it runs again next time (anything else is a bug: the job's
        task dies, and with it the worker, see `_helper_ended`)."""
        while True:
            await asyncio.sleep(job.every)
            try:
                outcome = await job.run(self.clock())
            except DB_ERRORS as exc:
                self.log.warning("periodic_job_failed", job=job.name, error=_describe(exc))
                continue
            if outcome:
                self.log.info(job.name, **outcome)

    async def _listen(self, url: str) -> None:
        from mailbag.store.listen import listen

        await listen(url, store.NOTIFY_CHANNEL, self.wake.set, self.log, self.config.db_timeout)

    async def _drain(self) -> None:
        """Stop claiming; finish, finalize or release everything this worker holds."""
        self.stopping = True
        if self.send_tasks:
            _, late = await asyncio.wait(set(self.send_tasks), timeout=self.config.shutdown_grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        # Claimed messages whose send never began (none should remain, but be sure).
        for flight in list(self.in_flight.values()):
            if not flight.started and not flight.decided:
                self._decide(flight.token, flight.message, Disabled("worker shutting down"))
        if self.unwritten:
            await self._write_the_rest()
        if self.unwritten:
            self.log.error("shutdown_with_unwritten_outcomes", count=self.unwritten)

    async def _write_the_rest(self) -> None:
        """Wait for the finalizer to write every known outcome. A dead finalizer is replaced
        once, for the drain only, with the batch it held. What still cannot be written stays
        `processing`, its lease no longer renewed, until a sweep makes it `unknown`: most of
        those sends happened, and none is resent blindly (evidence or an operator decides)."""
        writer = self.helpers.get(FINALIZER)
        if writer is not None and writer.done():
            for item in self.writing:
                self.outcomes.put_nowait(item)
            self.writing = []
            writer = self.helpers[FINALIZER] = asyncio.create_task(
                self._write_outcomes(), name=FINALIZER
            )
        written = asyncio.ensure_future(self.all_written.wait())
        await asyncio.wait(
            {written, *([writer] if writer else [])},
            timeout=max(self.config.shutdown_grace, 5.0),
            return_when=asyncio.FIRST_COMPLETED,
        )
        written.cancel()
        if writer is not None and writer.done() and not writer.cancelled() and writer.exception():
            self.log.error("finalize_failed_at_shutdown", exc_info=writer.exception())


def _finalization(item: Outcome) -> store.Finalization:
    d = item.decision
    return store.Finalization(
        message_id=item.message.id,
        action=d.action,
        provider_message_id=d.provider_message_id,
        error=d.error,
        next_attempt_at=d.next_attempt_at,
        keep_attempt=d.keep_attempt,
        ambiguous_since=d.ambiguous_since,
    )


def _describe(exc: BaseException) -> str:
    # The class and first line only: driver messages can be long, and never include secrets
    # we pass (URLs are not part of SQLAlchemy's error text).
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:500]
