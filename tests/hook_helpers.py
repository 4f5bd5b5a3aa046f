"""Deliveries for the tests of the hooks' admin surfaces (API, CLI, console), made the way
production makes them: a worker's finalize of a tenant's messages fans out to its endpoints,
and a worker's claim and finalize of the deliveries settles them."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from mailbag.domain.delivery import Decision
from mailbag.domain.hooks import DAction
from mailbag.domain.states import Action
from mailbag.services.hooks import Hooks
from mailbag.settings import Settings
from mailbag.store import hooks as hook_store
from mailbag.store.database import make_async_engine
from mailbag.store.plan import run

from conftest import TestDB
from helpers import claim, enqueue, finalize

HOOKS_KEY = "hooks-key-for-tests-0123456789abcdef"
MAX_ATTEMPTS = 8
WORKED_AT = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)


def sent_and_failed(db: TestDB, tenant: str, n_sent: int, n_failed: int = 0) -> list[Any]:
    """Messages of the tenant a worker sent (n_sent) or failed for good (n_failed): each
    change fans out to the tenant's subscribed endpoints in its own transaction."""
    messages = enqueue(db, n_sent + n_failed, now=WORKED_AT, tenant_id=tenant)
    batch = claim(db, now=WORKED_AT, limit=n_sent + n_failed)
    outcomes = [
        (m.id, Decision(Action.MARK_SENT if i < n_sent else Action.FAIL, error=None))
        for i, m in enumerate(messages)
    ]
    # These messages stand for a worker that has hooks on (its engine says so).
    with db.fanning_out(hook_store.FanOut(enabled=True, max_attempts=MAX_ATTEMPTS)):
        finalize(db, batch.token, *outcomes, now=WORKED_AT)
    return messages


def settle_all(db: TestDB, action: DAction = DAction.BURY, status_code: int = 410) -> int:
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


class BlockingHooks:
    """The hooks service (services.hooks.Hooks, the only one) for sync tests: each call
    runs on an event loop of its own, in a thread (so that an async test may call it too),
    on an engine of its own for `db`, as the CLI runs it (asyncio.run on a fresh engine)."""

    def __init__(self, db: TestDB, settings: Settings) -> None:
        self.url, self.settings = db.url, settings

    @property
    def enabled(self) -> bool:
        return self.settings.hooks_enabled

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            async def run_once() -> Any:
                engine = make_async_engine(self.url, null_pool=True)
                try:
                    return await getattr(Hooks(engine, self.settings), name)(*args, **kwargs)
                finally:
                    await engine.dispose()

            with ThreadPoolExecutor(1) as thread:
                return thread.submit(asyncio.run, run_once()).result()

        return call
