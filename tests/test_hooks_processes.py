"""Event hooks delivered by real `mailbag worker` processes to a real receiver that
verifies every signature: workers SIGKILLed mid-POST lose no event (at least once, and a
second copy carries the first one's webhook-id), and a delivery that kills its worker every
time ends dead at HOOK_MAX_ATTEMPTS; a failing receiver gets its retries and then a dead
delivery, which an operator's replay sends again under the same webhook-id; and a hook URL
stored before the rule cannot stop `mailbag serve` from sending mail."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from api_helpers import TEST_SECRET_KEY
from hook_helpers import BlockingHooks
from mailbag.domain.hooks import DState
from mailbag.services.hooks import DeliveryFilter
from mailbag.settings import Settings
from mailbag.store.schema import hook_deliveries, outbox_messages
from servers import free_port, mailbag_env, start_mailbag, stop, wait_until_up

from conftest import TestDB
from helpers import enqueue
from hook_receiver import HookReceiver

pytestmark = pytest.mark.slow

HOOKS_KEY = "hooks-key-for-process-tests-0123456789abcdef"


def hooks_for(db: TestDB) -> BlockingHooks:
    settings = Settings(
        database_url=db.url,
        secret_key=TEST_SECRET_KEY,
        hooks_key=HOOKS_KEY,
        hook_allow_http_localhost=True,
    )
    return BlockingHooks(db, settings)


def worker_env(db: TestDB, tmp_path: Path, **settings: str) -> dict[str, str]:
    base = {
        "provider": "file",
        "file_dir": str(tmp_path / "mail"),
        "hooks_key": HOOKS_KEY,
        "poll_interval": "0.2",
        "lease_seconds": "2",
        "hook_timeout_seconds": "1",
        "hook_retry_base_seconds": "0.2",
        "hook_allow_http_localhost": "true",  # the receiver listens on 127.0.0.1
    }
    return mailbag_env(db.url, **{**base, **settings})


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[Any]:
    return start_mailbag("worker", env=env, stdout=subprocess.DEVNULL, stderr=log.open("ab"))


def statuses(db: TestDB) -> dict[str, int]:
    with db.engine.connect() as conn:
        rows = conn.execute(select(hook_deliveries.c.status)).scalars().all()
    counts: dict[str, int] = defaultdict(int)
    for status in rows:
        counts[status] += 1
    return dict(counts)


def holding(db: TestDB, workers: list[subprocess.Popen[Any]]) -> int | None:
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


@pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)
def test_a_delivery_that_kills_its_worker_every_time_ends_dead_at_max_attempts(db, tmp_path):
    # The finding: a lease expiry moved it back to retrying without spending an attempt;
    # seen at attempts 7 of max 2, still processing.
    hooks = hooks_for(db)
    with HookReceiver(delay=30.0) as receiver:  # holds every POST until the kill
        receiver.secret = hooks.create_endpoint("default", receiver.url, ["sent"]).secret
        enqueue(db, 1)
        # The lease is twice HOOK_TIMEOUT_SECONDS: 3 s; the receiver never answers in time.
        env = worker_env(db, tmp_path, hook_max_attempts="2", hook_timeout_seconds="1.5")
        log = tmp_path / "worker.log"
        worker = start_worker(env, log)
        kills = 0
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and statuses(db) != {DState.DEAD.value: 1}:
                if receiver.in_flight and holding(db, [worker]) == 0:
                    stop(worker, signal.SIGKILL)  # mid-POST, again and again
                    kills += 1
                    worker = start_worker(env, log)
                    wait_for(lambda: not receiver.in_flight or receiver.in_flight > 1, 10, "")
                time.sleep(0.05)
        finally:
            code = stop(worker)
        assert code == 0, log.read_text()[-3000:]
    assert statuses(db) == {DState.DEAD.value: 1}, log.read_text()[-3000:]
    (delivery,) = hooks.list_deliveries(DeliveryFilter()).deliveries
    assert (delivery.attempts, delivery.max_attempts) == (2, 2)
    assert kills == 2 and len(receiver.received) == 0


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_bad_hook_url_neither_registers_nor_stops_serve_from_sending_mail(db, tmp_path):
    from mailbag.domain.hooks import SecretBox, new_secret

    env = worker_env(db, tmp_path, hook_allow_http_localhost="false")
    # Refused where it is registered, with the reason, and nothing written ...
    added = subprocess.run(
        [
            sys.executable,
            "-m",
            "mailbag",
            "hooks",
            "add",
            "default",
            "https://0177.0.0.1:9/hook",
            "--event",
            "sent",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert added.returncode == 2 and "not a valid URL" in added.stderr, added.stderr
    assert hooks_for(db).list_endpoints() == []
    # ... and one stored before the rule existed fails its own deliveries only: `serve`
    # once exited at the first `sent` event, and again at every restart.
    from mailbag.domain.hooks import HookEndpoint, HookEvent
    from mailbag.domain.ids import uuid7
    from mailbag.store import hooks as hook_store
    from mailbag.store.plan import run

    from helpers import T0

    legacy = HookEndpoint(
        uuid7(),
        "default",
        "https://0177.0.0.1:9/hook",
        frozenset({HookEvent.SENT}),
        True,
        None,
        T0,
        T0,
    )
    with db.engine.begin() as conn:
        run(conn, hook_store.create_endpoint(legacy, SecretBox(HOOKS_KEY).seal(new_secret())))
    port = free_port()
    log = tmp_path / "serve.log"
    serve = start_mailbag(
        "serve",
        env={**env, "MAILBAG_API_PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )
    try:
        wait_until_up(f"http://127.0.0.1:{port}/healthz", process=serve)
        enqueue(db, 5)
        wait_for(lambda: len(list((tmp_path / "mail").glob("*.eml"))) == 5, 30, "five emails")
        wait_for(lambda: statuses(db).get(DState.RETRYING.value) == 5, 30, "five failed POSTs")
        enqueue(db, 5)  # still sending after the deliveries failed
        wait_for(lambda: len(list((tmp_path / "mail").glob("*.eml"))) == 10, 30, "ten emails")
        assert serve.poll() is None, log.read_text()[-3000:]
    finally:
        code = stop(serve)
    assert code == 0, log.read_text()[-3000:]
    tried = [d for d in hooks_for(db).list_deliveries(DeliveryFilter()).deliveries if d.attempts]
    assert len(tried) >= 5
    assert all(d.last_error.startswith("forbidden: the URL is not a valid URL") for d in tried)
