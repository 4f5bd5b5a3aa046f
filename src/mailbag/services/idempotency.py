"""Idempotent POSTs: the same (tenant, key, request) gives the same answer, however often.

The request is validated and fingerprinted before anything is written. Then, in ONE
transaction: take the key (insert its record), do the work, store the response. A second
request with the key finds the record and replays it (same fingerprint) or gets a
conflict (different fingerprint). Two racing requests both try to insert: the database
makes the loser wait for the winner's commit and then fail on the unique index; the loser
rolls back all it did and replays the winner's record. A record is never overwritten.
Only successes are recorded: a request that fails (a 409, a 429) can be retried later.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from mailbag.store import idempotency as store
from mailbag.store.session import AsyncDatabase, AsyncSession, Conflict

KEY_PATTERN = re.compile(r"^[\x20-\x7e]{1,255}$")  # printable ASCII, 1 to 255 characters


class InvalidIdempotencyKey(ValueError):
    pass


class KeyReused(Exception):
    """The key was first used for a different request: never silently change its meaning."""

    def __init__(self, operation: str) -> None:
        self.operation = operation
        super().__init__(
            f"this Idempotency-Key was already used for a different request ({operation})"
        )


@dataclass(frozen=True)
class Response:
    status: int
    body: Any
    resource_id: str | None = None
    replayed: bool = False


Work = Callable[[AsyncSession], Awaitable[Response]]


def check_key(key: str | None) -> str | None:
    if key is not None and not KEY_PATTERN.match(key):
        raise InvalidIdempotencyKey("Idempotency-Key must be 1 to 255 printable ASCII characters")
    return key


def fingerprint(operation: str, fields: dict[str, Any]) -> str:
    """A hash of the normalized fields that define the operation (canonical JSON)."""
    canonical = json.dumps(
        {"operation": operation, **fields}, sort_keys=True, separators=(",", ":"), default=str
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def key_hash(key: str) -> str:
    """What logs carry instead of the key itself."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _replay(record: store.Record, operation: str, request_fingerprint: str) -> Response:
    if record.fingerprint != request_fingerprint:
        raise KeyReused(record.operation)
    assert record.response_status is not None  # written in the transaction that took the key
    return Response(record.response_status, record.response_body, record.resource_id, True)


async def execute(
    db: AsyncDatabase,
    *,
    tenant_id: str,
    key: str | None,
    operation: str,
    request_fingerprint: str,
    now: datetime,
    ttl: timedelta,
    work: Work,
) -> Response:
    """Run `work` at most once per (tenant, key); replay its stored response afterwards."""
    if key is None:
        async with db.transaction() as tx:
            return await work(tx)
    try:
        async with db.transaction() as tx:
            existing = await tx.run(store.find(tenant_id, key))
            if existing is not None and existing.expires_at > now:
                return _replay(existing, operation, request_fingerprint)
            if existing is not None:
                await tx.run(store.drop_if_expired(tenant_id, key, now))
            await tx.run(
                store.take_key(
                    tenant_id=tenant_id,
                    key=key,
                    operation=operation,
                    fingerprint=request_fingerprint,
                    now=now,
                    expires_at=now + ttl,
                )
            )
            response = await work(tx)
            await tx.run(
                store.record_response(
                    tenant_id=tenant_id,
                    key=key,
                    resource_id=response.resource_id,
                    status=response.status,
                    body=response.body,
                )
            )
            return response
    except Conflict:
        # Either another request took the key first (replay it), or the work itself hit a
        # unique index (its caller knows what that means).
        async with db.connect() as tx:
            winner = await tx.run(store.find(tenant_id, key))
        if winner is None or winner.response_status is None:
            raise
        return _replay(winner, operation, request_fingerprint)
