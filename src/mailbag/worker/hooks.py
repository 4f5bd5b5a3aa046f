"""The hook deliverer: an optional part of `mailbag worker` that POSTs due event hooks.

Each round (`run_once`, every POLL_INTERVAL): sweep deliveries whose lease ran out, then
claim due deliveries under a lease and POST each, signed (Standard Webhooks,
domain/hooks.py), each bounded by HOOK_TIMEOUT_SECONDS from connect to answer. A delivery
goes as soon as there is room for it, and its result is recorded as soon as the round
reads the queue again: whenever POSTs finish (or every POLL_INTERVAL while some are in
flight), one transaction records every POST that finished (one statement per kind of
outcome, store/hooks.py `settle_claims`) and claims what the room left allows, so a
receiver that hangs holds only its own deliveries.

Fairness between endpoints (store/hooks.py `Fairness`): at most
HOOK_MAX_IN_FLIGHT_PER_ENDPOINT of one endpoint's deliveries in flight; after
HOOK_BREAKER_FAILURES failed attempts in a row its breaker opens, its deliveries wait
(spending no attempt), then one probe goes; a 2xx closes it.

Outcomes: a 2xx is delivered; anything else (another status, a redirect - never followed -,
a refused or timed-out connection, a destination the rules forbid, even a bug of ours) is
retried with backoff and full jitter, dead once HOOK_MAX_ATTEMPTS are spent. Only a
classified reason and the status code are kept (worker/hook_http.py), never the body.

No transaction is open during a POST. At least once: a worker that dies mid-POST leaves
its deliveries `processing` until their lease runs out; the sweep then counts the attempt
and retries them (or buries them at the last one), and a receiver may see one twice, with
the same webhook-id (its dedup key). A stop (SIGTERM) cancels the POSTs in flight and
hands them back at once (no attempt spent).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag import log, metrics
from mailbag.clock import Clock, utcnow
from mailbag.domain.hooks import DAction, SecretBox, WrongHooksKey, parse_secret, signed_headers
from mailbag.domain.hooks import urls as hook_urls
from mailbag.domain.policy import RetryPolicy
from mailbag.providers.kit import describe
from mailbag.resolver import resolver_for
from mailbag.settings import Settings
from mailbag.store import hooks as store
from mailbag.store.database import within
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase
from mailbag.worker import hook_http
from mailbag.worker.failures import DB_ERRORS
from mailbag.worker.hook_http import Failure, Reason

T = TypeVar("T")
USER_AGENT = "mailbag-hooks"
TASK = "hooks"  # this part's name in logs and in mailbag_side_task_failures_total


@dataclass(frozen=True)
class HookConfig:
    worker_id: str
    timeout: float = 10.0  # one POST, connect to answer
    lease: timedelta = timedelta(minutes=2)
    policy: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(max_attempts=8, base=timedelta(seconds=10))
    )
    batch_size: int = 50  # deliveries in flight at once, across endpoints
    every: float = 1.0
    # How long a turn waits for POSTs just started (`_gather`): about one answer from a
    # receiver on the same network.
    gather: float = 0.002
    db_timeout: float = 5.0
    fairness: store.Fairness = field(default_factory=store.Fairness)
    destinations: hook_urls.Policy = field(default_factory=hook_urls.Policy)

    @classmethod
    def from_settings(cls, settings: Settings) -> HookConfig:
        timeout = settings.hook_timeout_seconds
        return cls(
            worker_id=settings.worker_id,
            timeout=timeout,
            # A POST ends within the timeout: twice that leaves as much again for recording
            # it before anyone may sweep it.
            lease=timedelta(seconds=max(settings.lease_seconds, 2 * timeout)),
            policy=settings.hook_retry_policy,
            every=settings.poll_interval,
            db_timeout=settings.database_timeout_seconds,
            fairness=store.Fairness(
                in_flight=settings.hook_max_in_flight_per_endpoint,
                breaker=settings.hook_breaker,
            ),
            destinations=settings.hook_url_policy,
        )


@dataclass
class _InFlight:
    token: uuid.UUID
    claimed: store.ClaimedDelivery
    since: float  # time.monotonic() when its POST started


@dataclass(frozen=True)
class _Target:
    secret: bytes
    to: hook_urls.Destination


TARGETS_KEPT = 10_000  # endpoints' opened secrets and checked URLs kept (then all dropped)


class HookDeliverer:
    def __init__(
        self,
        engine: AsyncEngine,
        box: SecretBox,
        config: HookConfig,
        *,
        client: hook_http.Poster | None = None,
        guard: hook_http.Guard | None = None,
        clock: Clock = utcnow,
        rng: random.Random | None = None,
    ) -> None:
        self.db, self.box, self.config, self.clock = AsyncDatabase(engine), box, config, clock
        self.rng = rng or random.Random()
        self.client = client or hook_http.HookClient(
            guard or hook_http.Guard(config.destinations), connections=config.batch_size
        )
        self.log = log.get("mailbag.hooks", worker_id=config.worker_id)
        self.releasing: set[asyncio.Future[None]] = set()
        self.targets: dict[tuple[str, str], _Target | Failure] = {}

    async def aclose(self) -> None:
        # A run cancelled with POSTs in flight hands them back in a task of its own (so the
        # cancel cannot cut the release short): it finishes with the client and the
        # database it uses, before either is closed.
        await asyncio.gather(*self.releasing, return_exceptions=True)
        await self.client.aclose()

    async def run_once(self, now: datetime | None = None) -> Mapping[str, int]:
        """Sweep, then deliver until nothing is due and nothing is in flight; what
        happened, by outcome (only those that happened).

        Each turn is one transaction (store.turn): record the POSTs that finished since the
        last one, then claim as many due deliveries as there is room for. The two go
        together because a finished POST's row still counts in flight for its endpoint
        (Fairness) until it is recorded: a claim in the same transaction sees the room
        the recording made."""
        counts: Counter[str] = Counter()
        await self._sweep(now or self.clock(), counts)
        swept_at = time.monotonic()
        in_flight: dict[asyncio.Task[store.Attempted], _InFlight] = {}
        finished: dict[uuid.UUID, list[store.Attempted]] = {}  # by claim token
        try:
            look = True
            while True:
                room = self.config.batch_size - len(in_flight) if look else 0
                if finished or room > 0:
                    settled, claim = await self._run(
                        store.turn(
                            finished,
                            worker_id=self.config.worker_id,
                            now=self.clock(),
                            lease=self.config.lease,
                            limit=room,
                            fairness=self.config.fairness,
                        ),
                        at_once=True,
                    )
                    finished = {}
                    self._count(settled, counts)
                    for claimed in claim.deliveries:
                        task = asyncio.create_task(self.attempt(claimed))
                        in_flight[task] = _InFlight(claim.token, claimed, time.monotonic())
                    look = len(claim.deliveries) == room > 0  # full: more may be due
                if not in_flight:
                    break
                done, _ = await asyncio.wait(
                    in_flight, timeout=self.config.every, return_when=asyncio.FIRST_COMPLETED
                )
                done |= await self._gather(in_flight, done)
                for task in done:
                    finished.setdefault(in_flight.pop(task).token, []).append(task.result())
                look = True  # slots freed, or a poll interval passed: read the queue again
                if time.monotonic() - swept_at >= self.config.every:
                    await self._sweep(self.clock(), counts)
                    swept_at = time.monotonic()
        finally:
            if in_flight:  # stopped (or the database failed): hand the rest back now
                release = asyncio.ensure_future(self._release(in_flight))
                self.releasing.add(release)
                release.add_done_callback(self.releasing.discard)
                await asyncio.shield(release)
        return dict(counts)

    async def _gather(
        self,
        in_flight: Mapping[asyncio.Task[store.Attempted], _InFlight],
        done: set[asyncio.Task[store.Attempted]],
    ) -> set[asyncio.Task[store.Attempted]]:
        """Of the POSTs started less than `gather` seconds ago, those that finish before the
        oldest of them is that old: POSTs claimed together go out and answer together, and
        a turn that waits for them records (and claims) them all at once instead of one
        turn for each. A POST older than that is slow, and no turn waits for it: a hanging
        receiver holds nobody's turn."""
        now = time.monotonic()
        young = [
            t
            for t, held in in_flight.items()
            if t not in done and now - held.since < self.config.gather
        ]
        if not young or not done:
            return set()
        oldest = min(in_flight[t].since for t in young)
        more, _ = await asyncio.wait(young, timeout=self.config.gather - (now - oldest))
        return more

    async def _sweep(self, now: datetime, counts: Counter[str]) -> None:
        swept = await self._run(store.sweep(now=now, actor=self.config.worker_id))
        if not swept:
            return
        metrics.HOOK_LEASE_EXPIRATIONS.inc(len(swept))
        counts["hooks_swept"] += len(swept)
        for delivery in swept:
            self.log.warning(
                "hook_lease_expired",
                delivery_id=str(delivery.id),
                webhook_id=delivery.webhook_id,
                attempt=delivery.attempts,
                dead=delivery.status.value == "dead",
            )

    def _count(self, settled: store.Settled, counts: Counter[str]) -> None:
        for delivery in settled.deliveries:
            metrics.HOOK_DELIVERIES.labels(delivery.status.value).inc()
            counts[f"hooks_{delivery.status.value}"] += 1
        for endpoint_id, until in settled.paused.items():
            metrics.HOOK_ENDPOINT_PAUSES.inc()
            self.log.warning(
                "hook_endpoint_paused", endpoint_id=str(endpoint_id), until=until.isoformat()
            )

    async def _release(self, in_flight: dict[asyncio.Task[store.Attempted], _InFlight]) -> None:
        """Give deliveries back unrecorded (no attempt spent), so the next worker need not
        wait for their lease: a POST cut short may still have arrived (same webhook-id)."""
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        by_token: dict[uuid.UUID, list[store.Attempted]] = {}
        for held in in_flight.values():
            by_token.setdefault(held.token, []).append(
                store.Attempted(held.claimed.delivery.id, DAction.RELEASE)
            )
        try:
            await self._run(
                store.settle_claims(
                    by_token,
                    now=self.clock(),
                    actor=self.config.worker_id,
                    breaker=self.config.fairness.breaker,
                )
            )
        except DB_ERRORS as exc:  # the lease runs out instead, and the sweep retries them
            self.log.warning("hook_release_failed", error=describe(exc))

    async def attempt(self, claimed: store.ClaimedDelivery) -> store.Attempted:
        """POST one delivery; what became of it (no database here). Never raises but to be
        cancelled: whatever goes wrong fails this delivery's attempt, not the deliverer."""
        delivery = claimed.delivery
        try:
            status_code, failure = await self._post(claimed)
        except Exception as exc:  # a bug: this attempt fails, mail and other hooks go on
            metrics.SIDE_TASK_FAILURES.labels(TASK).inc()
            self.log.error("hook_attempt_crashed", delivery_id=str(delivery.id), exc_info=exc)
            status_code, failure = None, hook_http.failure_of(exc)
        attempts_done = delivery.attempts + 1
        if failure is None:
            action = DAction.DELIVER
        elif attempts_done >= delivery.max_attempts:
            action = DAction.BURY
        else:
            action = DAction.RETRY
        if failure is not None:
            self.log.info(
                "hook_attempt_failed",
                delivery_id=str(delivery.id),
                webhook_id=delivery.webhook_id,
                attempt=attempts_done,
                status_code=status_code,
                reason=failure.reason.value,
                error=failure.detail,
                dead=action is DAction.BURY,
            )
        return store.Attempted(
            delivery.id,
            action,
            status_code=status_code,
            error=None if failure is None else str(failure),
            next_attempt_at=(
                self.clock() + self.config.policy.delay(attempts_done, self.rng)
                if action is DAction.RETRY
                else None
            ),
        )

    async def _post(self, claimed: store.ClaimedDelivery) -> tuple[int | None, Failure | None]:
        delivery = claimed.delivery
        target = self._target(claimed)
        if isinstance(target, Failure):
            return None, target
        body = delivery.payload.encode()
        headers = {
            **signed_headers(target.secret, delivery.webhook_id, int(time.time()), body),
            "content-type": "application/json",
            "user-agent": USER_AGENT,
        }
        started = time.perf_counter()
        try:
            # The whole exchange, not each phase: a receiver answering one byte at a time
            # must not hold its slot (and the lease) longer than the timeout.
            async with asyncio.timeout(self.config.timeout):
                status_code = await self.client.post(target.to, body, headers)
            return status_code, hook_http.answered(status_code)
        except TimeoutError:
            return None, Failure(Reason.TIMEOUT, f"no answer within {self.config.timeout:g} s")
        except hook_http.POST_ERRORS as exc:
            return None, hook_http.failure_of(exc)
        finally:
            metrics.HOOK_POST_SECONDS.observe(time.perf_counter() - started)

    def _target(self, claimed: store.ClaimedDelivery) -> _Target | Failure:
        """The endpoint's secret, opened, and its URL, checked against the rule again (an
        endpoint stored before it, or under a looser one): once per endpoint URL and
        sealed secret, not once per POST (Fernet and the URL parser cost more than the
        POST). What cannot be opened or sent to is a failure of each of its deliveries."""
        key = (claimed.url, claimed.sealed_secret)
        found = self.targets.get(key)
        if found is None:
            if len(self.targets) >= TARGETS_KEPT:
                self.targets.clear()
            found = self.targets[key] = self._open(claimed)
        return found

    def _open(self, claimed: store.ClaimedDelivery) -> _Target | Failure:
        try:
            secret = parse_secret(self.box.open(claimed.sealed_secret))
        except (WrongHooksKey, ValueError) as exc:
            return Failure(Reason.INTERNAL, str(exc))
        try:
            return _Target(secret, hook_urls.check(claimed.url, self.config.destinations))
        except hook_urls.UnsafeUrl as exc:
            return Failure(Reason.FORBIDDEN, f"the URL {exc}")

    async def _run(self, plan: Plan[T], *, at_once: bool = False) -> T:
        """`plan` in a transaction, within DB_TIMEOUT; `at_once`: what it yields together
        is sent at once (AsyncDatabase.run_at_once: a turn in two round trips). A cancel
        (the worker stopping) waits for the transaction in flight to end (DB_TIMEOUT at
        most) instead of cutting it: cut on aiosqlite, it held SQLite's write lock against
        the release that follows, and its connection's close could wait on its thread past
        the event loop's end."""
        transaction = self.db.run_at_once(plan) if at_once else self._transaction(plan)
        work = asyncio.ensure_future(within(self.config.db_timeout, transaction))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            await asyncio.wait([work])
            raise

    async def _transaction(self, plan: Plan[T]) -> T:
        async with self.db.transaction() as tx:
            return await tx.run(plan)


def deliverer(settings: Settings, engine: AsyncEngine) -> HookDeliverer | None:
    """The deliverer a worker runs, or None while HOOKS_KEY is unset (hooks off)."""
    if settings.hooks_key is None:
        return None
    config = HookConfig.from_settings(settings)
    guard = hook_http.Guard(config.destinations, resolver_for(settings.dns_nameservers))
    return HookDeliverer(
        engine, SecretBox(settings.hooks_key.get_secret_value()), config, guard=guard
    )
