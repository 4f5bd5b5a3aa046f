"""Event hooks delivered by real `mailbag worker` processes to a real receiver that
verifies every signature: workers SIGKILLed mid-POST lose no event (at least once, and a
second copy carries the first one's webhook-id), a failing receiver gets its retries and
then a dead delivery, which an operator's replay sends again under the same webhook-id."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from api_helpers import TEST_SECRET_KEY
from mailbag.domain.hooks import DState
from mailbag.services.hooks import DeliveryFilter, SyncHooks
from mailbag.settings import Settings
from mailbag.store.schema import hook_deliveries, outbox_messages
from servers import mailbag_env, start_mailbag, stop

from helpers import enqueue
from hook_receiver import HookReceiver

pytestmark = pytest.mark.slow

HOOKS_KEY = "hooks-key-for-process-tests-0123456789abcdef"


def hooks_for(db: Any) -> SyncHooks:
    settings = Settings(
        database_url=db.url,
        secret_key=TEST_SECRET_KEY,
        hooks_key=HOOKS_KEY,
        hook_allow_http_localhost=True,
    )
    return SyncHooks(db.engine, settings)


def worker_env(db: Any, tmp_path: Path, **settings: str) -> dict[str, str]:
    base = {
        "provider": "file",
        "file_dir": str(tmp_path / "mail"),
        "hooks_key": HOOKS_KEY,
        "poll_interval": "0.2",
        "lease_seconds": "2",
        "hook_timeout_seconds": "1",
        "hook_retry_base_seconds": "0.2",
    }
    return mailbag_env(db.url, **{**base, **settings})


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[Any]:
    return start_mailbag("worker", env=env, stdout=subprocess.DEVNULL, stderr=log.open("ab"))


def statuses(db: Any) -> dict[str, int]:
    with db.engine.connect() as conn:
        rows = conn.execute(select(hook_deliveries.c.status)).scalars().all()
    counts: dict[str, int] = defaultdict(int)
    for status in rows:
        counts[status] += 1
    return dict(counts)


def holding(db: Any, workers: list[subprocess.Popen[Any]]) -> int | None:
    """The index of a worker that holds deliveries under a lease right now, if one does."""
    with db.engine.connect() as conn:
        holders = set(
            conn.execute(
                select(hook_deliveries.c.claimed_by).where(
                    hook_deliveries.c.status == DState.PROCESSING.value
                )
            ).scalars()
        )
    pids = {int(holder.rpartition(":")[2]) for holder in holders if holder}
    return next((i for i, w in enumerate(workers) if w.pid in pids), None)


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)
def test_workers_killed_mid_delivery_lose_no_event_and_copies_share_a_webhook_id(db, tmp_path):
    total = 60
    hooks = hooks_for(db)
    with HookReceiver(delay=0.3) as receiver:
        receiver.secret = hooks.create_endpoint("default", receiver.url, ["sent", "unknown"]).secret
        enqueue(db, total)
        env = worker_env(db, tmp_path, hook_max_attempts="50")
        log = tmp_path / "workers.log"
        workers = [start_worker(env, log) for _ in range(2)]
        kills = 0
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and kills < 3:
                victim = holding(db, workers) if receiver.in_flight else None
                if victim is not None:
                    stop(workers[victim], signal.SIGKILL)  # mid-POST: the receiver holds one
                    workers[victim] = start_worker(env, log)
                    kills += 1
                    time.sleep(1.0)
                time.sleep(0.02)
            assert kills == 3, "the run ended before a worker could be killed mid-delivery"
            wait_for(
                lambda: statuses(db) == {DState.DELIVERED.value: total},
                120,
                "every delivery delivered",
            )
        finally:
            codes = [stop(w) for w in workers]
        assert codes == [0, 0], log.read_text()[-3000:]

    assert receiver.rejected == 0  # every POST was signed with the endpoint's secret
    with db.engine.connect() as conn:
        messages = conn.execute(select(outbox_messages.c.id, outbox_messages.c.status)).all()
        stored = conn.execute(select(hook_deliveries.c.webhook_id)).scalars().all()
    # Every message's one event (sent, or unknown where a killed worker held the email)
    # arrived at least once ...
    by_message: dict[str, set[str]] = defaultdict(set)
    for received in receiver.delivered():
        by_message[received.body["data"]["message_id"]].add(received.webhook_id)
    assert set(by_message) == {str(m.id) for m in messages}
    # ... and every copy of one event carries the same webhook-id, the one stored.
    assert all(len(ids) == 1 for ids in by_message.values())
    assert receiver.ids() == set(stored)
    copies = sum(receiver.attempts.values()) - len(receiver.attempts)
    assert copies >= 1, "a worker killed mid-POST should have caused a second copy"


@pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)
def test_a_failing_receiver_gets_retries_then_dead_and_a_replay_delivers_it(db, tmp_path):
    hooks = hooks_for(db)
    with HookReceiver(fail_first=1000, fail_status=503) as receiver:
        receiver.secret = hooks.create_endpoint("default", receiver.url, ["sent"]).secret
        (message,) = enqueue(db, 1)
        env = worker_env(db, tmp_path, hook_max_attempts="3")
        worker = start_worker(env, tmp_path / "worker.log")
        try:
            wait_for(lambda: statuses(db) == {DState.DEAD.value: 1}, 60, "the delivery dead")
            assert len(receiver.received) == 3  # HOOK_MAX_ATTEMPTS, then no more
            time.sleep(1.0)
            assert len(receiver.received) == 3
            (delivery,) = hooks.list_deliveries(DeliveryFilter()).deliveries
            assert (delivery.attempts, delivery.last_status_code) == (3, 503)

            receiver.fail_first = 0  # the receiver is fixed; an operator replays
            hooks.replay(delivery.id, actor="ops")
            wait_for(lambda: statuses(db) == {DState.DELIVERED.value: 1}, 60, "the replay")
        finally:
            code = stop(worker)
        assert code == 0, (tmp_path / "worker.log").read_text()[-3000:]
    assert {r.webhook_id for r in receiver.received} == {delivery.webhook_id}
    (accepted,) = receiver.delivered()
    assert accepted.body["type"] == "message.sent"
    assert accepted.body["data"]["message_id"] == str(message.id)
    assert json.dumps(accepted.body).find("User 0") == -1  # no template data in a payload
