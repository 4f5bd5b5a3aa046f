"""The hook deliverer: a side job of `mailbag worker` that POSTs due event hooks.

Each round (every POLL_INTERVAL): sweep deliveries whose lease ran out back to
`retrying`, then claim due deliveries in batches under a lease and POST each, signed
(Standard Webhooks, domain/hooks.py), concurrently, each bounded by HOOK_TIMEOUT_SECONDS
from connect to answer; then record the batch in one transaction: a 2xx is delivered,
anything else (another status, a redirect - never followed -, a connection error, the
timeout) is retried with backoff and full jitter, dead once HOOK_MAX_ATTEMPTS are spent.

No transaction is open during a POST. At least once: a worker that dies mid-batch leaves
its deliveries `processing` until their lease runs out; the sweep then retries them, and a
receiver may see one twice, with the same webhook-id (its dedup key). A stop (SIGTERM)
cancels the POSTs in flight and hands their batch back at once (no attempt spent).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag import log, metrics
from mailbag.clock import Clock, utcnow
from mailbag.domain.hooks import (
    DAction,
    SecretBox,
    WrongHooksKey,
    outcome,
    parse_secret,
    signed_headers,
)
from mailbag.domain.policy import RetryPolicy
from mailbag.providers.kit import describe
from mailbag.settings import Settings
from mailbag.store import hooks as store
from mailbag.store.database import within
from mailbag.store.plan import Plan
from mailbag.store.session import AsyncDatabase
from mailbag.worker.failures import DB_ERRORS

T = TypeVar("T")
USER_AGENT = "mailbag-hooks"
ERROR_BODY_BYTES = 200  # of a non-2xx answer's body, kept in last_error


@dataclass(frozen=True)
class HookConfig:
    worker_id: str
    timeout: float = 10.0  # one POST, connect to answer
    lease: timedelta = timedelta(minutes=2)
    policy: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(max_attempts=8, base=timedelta(seconds=10))
    )
    batch_size: int = 50  # deliveries claimed, and POSTed at once
    every: float = 1.0
    db_timeout: float = 5.0

    @classmethod
    def from_settings(cls, settings: Settings) -> HookConfig:
        timeout = settings.hook_timeout_seconds
        return cls(
            worker_id=settings.worker_id,
            timeout=timeout,
            # The batch's POSTs end within the timeout: twice that leaves as much again for
            # recording them before anyone may sweep the batch.
            lease=timedelta(seconds=max(settings.lease_seconds, 2 * timeout)),
            policy=settings.hook_retry_policy,
            every=settings.poll_interval,
            db_timeout=settings.database_timeout_seconds,
        )


class HookDeliverer:
    def __init__(
        self,
        engine: AsyncEngine,
        box: SecretBox,
        config: HookConfig,
        *,
        client: httpx.AsyncClient | None = None,
        clock: Clock = utcnow,
        rng: random.Random | None = None,
    ) -> None:
        self.db, self.box, self.config, self.clock = AsyncDatabase(engine), box, config, clock
        self.rng = rng or random.Random()
        self.client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(config.timeout), follow_redirects=False
        )
        self.log = log.get("mailbag.hooks", worker_id=config.worker_id)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def run_once(self, now: datetime | None = None) -> Mapping[str, int]:
        """Sweep, then deliver what is due, batch after batch while batches come full;
        what happened, by outcome (only those that happened)."""
        counts: Counter[str] = Counter()
        swept = await self._run(store.sweep(now=now or self.clock(), actor=self.config.worker_id))
        if swept:
            metrics.HOOK_LEASE_EXPIRATIONS.inc(len(swept))
            counts["hooks_swept"] += len(swept)
            for delivery in swept:
                self.log.warning(
                    "hook_lease_expired",
                    delivery_id=str(delivery.id),
                    webhook_id=delivery.webhook_id,
                    attempt=delivery.attempts,
                )
        while True:
            claim = await self._run(
                store.claim(
                    worker_id=self.config.worker_id,
                    now=self.clock(),
                    lease=self.config.lease,
                    limit=self.config.batch_size,
                )
            )
            if not claim.deliveries:
                break
            try:
                results = await asyncio.gather(*(self.attempt(c) for c in claim.deliveries))
            except asyncio.CancelledError:  # the worker stops: hand the batch back now
                await asyncio.shield(self._release(claim))
                raise
            done = await self._run(
                store.finalize(
                    token=claim.token,
                    results=results,
                    now=self.clock(),
                    actor=self.config.worker_id,
                )
            )
            for delivery in done:
                metrics.HOOK_DELIVERIES.labels(delivery.status.value).inc()
                counts[f"hooks_{delivery.status.value}"] += 1
            if len(claim.deliveries) < self.config.batch_size:
                break
        return dict(counts)

    async def _release(self, claim: store.HookClaim) -> None:
        """Give a batch back unrecorded (no attempt spent), so the next worker need not
        wait for its lease: a POST cut short may still have arrived (same webhook-id)."""
        released = [store.Attempted(c.delivery.id, DAction.RELEASE) for c in claim.deliveries]
        try:
            await self._run(
                store.finalize(
                    token=claim.token,
                    results=released,
                    now=self.clock(),
                    actor=self.config.worker_id,
                )
            )
        except DB_ERRORS as exc:  # the lease runs out instead, and the sweep retries them
            self.log.warning("hook_release_failed", error=describe(exc))

    async def attempt(self, claimed: store.ClaimedDelivery) -> store.Attempted:
        """POST one delivery; what became of it (no database here)."""
        delivery = claimed.delivery
        status_code, error = await self._post(claimed)
        attempts_done = delivery.attempts + 1
        if outcome(status_code):
            action = DAction.DELIVER
        elif attempts_done >= delivery.max_attempts:
            action = DAction.BURY
        else:
            action = DAction.RETRY
        if action is not DAction.DELIVER:
            self.log.info(
                "hook_attempt_failed",
                delivery_id=str(delivery.id),
                webhook_id=delivery.webhook_id,
                attempt=attempts_done,
                status_code=status_code,
                error=error,
                dead=action is DAction.BURY,
            )
        return store.Attempted(
            delivery.id,
            action,
            status_code=status_code,
            error=error,
            next_attempt_at=(
                self.clock() + self.config.policy.delay(attempts_done, self.rng)
                if action is DAction.RETRY
                else None
            ),
        )

    async def _post(self, claimed: store.ClaimedDelivery) -> tuple[int | None, str | None]:
        delivery = claimed.delivery
        try:
            secret = parse_secret(self.box.open(claimed.sealed_secret))
        except (WrongHooksKey, ValueError) as exc:
            return None, str(exc)
        body = delivery.payload.encode()
        headers = {
            **signed_headers(secret, delivery.webhook_id, int(time.time()), body),
            "content-type": "application/json",
            "user-agent": USER_AGENT,
        }
        started = time.perf_counter()
        try:
            # The whole exchange, not each phase: a receiver answering one byte at a time
            # must not hold the batch (and its lease) longer than the timeout.
            async with asyncio.timeout(self.config.timeout):
                async with self.client.stream(
                    "POST", claimed.url, content=body, headers=headers
                ) as response:
                    if outcome(response.status_code):
                        return response.status_code, None
                    return response.status_code, await _error_text(response)
        except TimeoutError:
            return None, f"no answer within {self.config.timeout:g} s"
        except httpx.HTTPError as exc:
            return None, describe(exc)
        finally:
            metrics.HOOK_POST_SECONDS.observe(time.perf_counter() - started)

    async def _run(self, plan: Plan[T]) -> T:
        return await within(self.config.db_timeout, self._transaction(plan))

    async def _transaction(self, plan: Plan[T]) -> T:
        async with self.db.transaction() as tx:
            return await tx.run(plan)


async def _error_text(response: httpx.Response) -> str:
    """`HTTP 503: <the first bytes of the body>`, never more of a body than that."""
    head = b""
    async for chunk in response.aiter_bytes():
        head += chunk
        if len(head) >= ERROR_BODY_BYTES:
            break
    text = " ".join(head[:ERROR_BODY_BYTES].decode("utf-8", "replace").split())
    return f"HTTP {response.status_code}" + (f": {text}" if text else "")


def deliverer(settings: Settings, engine: AsyncEngine) -> HookDeliverer | None:
    """The deliverer a worker runs, or None while HOOKS_KEY is unset (hooks off)."""
    if settings.hooks_key is None:
        return None
    return HookDeliverer(
        engine, SecretBox(settings.hooks_key.get_secret_value()), HookConfig.from_settings(settings)
    )
