"""Deliveries for the tests of the hooks' admin surfaces (API, CLI, console), made the way
production makes them: a worker's finalize of a tenant's messages fans out to its endpoints,
and a worker's claim and finalize of the deliveries settles them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from mailbag.domain.delivery import Decision
from mailbag.domain.hooks import DAction
from mailbag.domain.states import Action
from mailbag.store import hooks as hook_store
from mailbag.store.plan import run

from helpers import claim, enqueue, finalize

HOOKS_KEY = "hooks-key-for-tests-0123456789abcdef"
MAX_ATTEMPTS = 8
WORKED_AT = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)


def sent_and_failed(db: Any, tenant: str, n_sent: int, n_failed: int = 0) -> list[Any]:
    """Messages of the tenant a worker sent (n_sent) or failed for good (n_failed): each
    change fans out to the tenant's subscribed endpoints in its own transaction."""
    messages = enqueue(db, n_sent + n_failed, now=WORKED_AT, tenant_id=tenant)
    batch = claim(db, now=WORKED_AT, limit=n_sent + n_failed)
    outcomes = [
        (m.id, Decision(Action.MARK_SENT if i < n_sent else Action.FAIL, error=None))
        for i, m in enumerate(messages)
    ]
    # The fan-out switch is the process's: an app built earlier without HOOKS_KEY may have
    # turned it off. These messages stand for a worker that has hooks on.
    was = (hook_store.FANOUT.enabled, hook_store.FANOUT.max_attempts)
    hook_store.configure(enabled=True, max_attempts=MAX_ATTEMPTS)
    try:
        finalize(db, batch.token, *outcomes, now=WORKED_AT)
    finally:
        hook_store.configure(enabled=was[0], max_attempts=was[1])
    return messages


def settle_all(db: Any, action: DAction = DAction.BURY, status_code: int = 410) -> int:
    """A worker's claim of every due delivery, each settled with `action` (BURY: dead,
    DELIVER: delivered, RETRY: retrying in an hour); how many."""
    now = datetime.now(UTC)
    with db.engine.begin() as conn:
        taken = run(
            conn,
            hook_store.claim(
                worker_id="hooks-test", now=now, lease=timedelta(minutes=1), limit=100
            ),
        )
        results = [
            hook_store.Attempted(
                c.delivery.id,
                action,
                status_code=status_code,
                error=None if action is DAction.DELIVER else f"HTTP {status_code}",
                next_attempt_at=now + timedelta(hours=1) if action is DAction.RETRY else None,
            )
            for c in taken.deliveries
        ]
        run(
            conn,
            hook_store.finalize(token=taken.token, results=results, now=now, actor="hooks-test"),
        )
    return len(results)
