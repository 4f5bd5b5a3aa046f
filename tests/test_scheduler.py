"""One scheduler among N replicas (worker/scheduler.py) and the housekeeping it runs
(services/maintenance.py).

In-process: two schedulers on separate lock sessions of a real database, driven by a
clock the test moves; the lock session of the leader is ended from outside, as when its
process dies. As processes: `mailbag worker` replicas, one of them SIGKILLed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.exc import OperationalError

from api_helpers import settings_for
from mailbag.domain.verification import VState
from mailbag.services import maintenance
from mailbag.store import verifications as verification_store
from mailbag.store.database import make_engine
from mailbag.store.leadership import FileLock, OnlyProcess, SessionLock, mysql_lock_name
from mailbag.store.plan import run
from mailbag.store.schema import (
    email_verifications,
    idempotency_records,
    outbox_messages,
    verification_events,
)
from mailbag.worker import PeriodicJob
from mailbag.worker.scheduler import Scheduler, lock_for, maintenance_jobs
from servers import mailbag_env, start_mailbag, stop

from conftest import TestDB
from helpers import T0, enqueue

LEASE = 3.0


class Ticks:
    """The scheduler's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.at = 0.0

    def __call__(self) -> float:
        return self.at


def counting_job(name: str, runs: list[str]) -> PeriodicJob:
    async def job(now: datetime) -> Mapping[str, int]:
        runs.append(name)
        return {"done": 1}

    return PeriodicJob(name, 1.0, job)


async def settle() -> None:
    """Let the job tasks a tick started run up to their first wait."""
    for _ in range(5):
        await asyncio.sleep(0)


def leader_gauge() -> float | None:
    return REGISTRY.get_sample_value("mailbag_scheduler_leader")


def end_session(db: TestDB, scheduler: Scheduler) -> None:
    """What the server does when the holder's process dies: its lock session ends."""
    lock = scheduler.lock
    if isinstance(lock, SessionLock):
        session = lock.session
        assert session is not None
        statement = {
            "postgresql": f"SELECT pg_terminate_backend({int(session)})",
            "mysql": f"KILL CONNECTION {int(session)}",
        }[db.dialect]
        with db.engine.connect() as conn:
            conn.execute(text(statement))
    else:  # a file lock ends with its process; closing the file is the same for the lock
        assert isinstance(lock, FileLock) and lock.fd is not None
        os.close(lock.fd)
        lock.fd = None


async def test_exactly_one_replica_runs_the_jobs_and_another_takes_over_within_a_lease(db):
    settings = settings_for(db, scheduler_lease_seconds=LEASE)
    ticks, runs = Ticks(), []
    hold = asyncio.Event()
    cancelled: list[str] = []

    async def long_job(now: datetime) -> Mapping[str, int]:
        runs.append("a")
        try:
            await hold.wait()
        except asyncio.CancelledError:
            cancelled.append("a")
            raise
        return {}

    a = Scheduler(
        lock_for(settings),
        [PeriodicJob("a", 1.0, long_job)],
        lease=LEASE,
        worker_id="a",
        monotonic=ticks,
    )
    b = Scheduler(
        lock_for(settings),
        [counting_job("b", runs)],
        lease=LEASE,
        worker_id="b",
        monotonic=ticks,
    )
    try:
        await a.tick(T0)
        await b.tick(T0)
        await settle()
        assert (a.leader, b.leader) == (True, False)
        assert runs == ["a"]  # the new leader runs its jobs at once; the other none
        assert getattr(b.lock, "connection", None) is None  # a follower holds no connection

        end_session(db, a)
        ticks.at = LEASE / 3  # the leader confirms its lock a third of a lease on
        await a.tick(T0)
        assert not a.leader and cancelled == ["a"]  # stepped down: its job stopped
        await b.tick(T0)
        assert not b.leader  # tries again a lease after its last try, not before

        ticks.at = LEASE  # within a lease of the holder's death
        await b.tick(T0)
        await a.tick(T0)
        await settle()
        assert (a.leader, b.leader) == (False, True)
        assert runs == ["a", "b"]

        ticks.at = LEASE / 3 + LEASE  # the one that stepped down tries again: in vain
        await a.tick(T0)
        await b.tick(T0)
        await settle()
        assert (a.leader, b.leader) == (False, True)
        assert runs == ["a", "b", "b"]  # only the leader runs jobs, each every `every`
    finally:
        hold.set()
        await a.close()
        await b.close()


async def test_a_replica_that_stops_hands_the_lock_over_at_the_next_try(db):
    settings = settings_for(db, scheduler_lease_seconds=LEASE)
    ticks, runs = Ticks(), []
    a = Scheduler(
        lock_for(settings), [counting_job("a", runs)], lease=LEASE, worker_id="a", monotonic=ticks
    )
    b = Scheduler(
        lock_for(settings), [counting_job("b", runs)], lease=LEASE, worker_id="b", monotonic=ticks
    )
    try:
        await a.tick(T0)
        await b.tick(T0)
        await settle()
        await a.close()  # SIGTERM: the worker drained and closes its jobs
        assert leader_gauge() == 0
        ticks.at = LEASE
        await b.tick(T0)
        await settle()
        assert b.leader and leader_gauge() == 1
        assert runs == ["a", "b"]
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)
async def test_the_lock_session_is_confirmed_to_be_the_one_that_took_the_lock(db):
    """Behind a transaction pooler the lock's next statement may reach another server
    session: the lock is then not this replica's to rely on, and it steps down."""
    settings = settings_for(db, scheduler_lease_seconds=LEASE)
    lock = lock_for(settings)
    assert isinstance(lock, SessionLock)
    scheduler = Scheduler(lock, [], lease=LEASE, worker_id="a", monotonic=Ticks())
    try:
        await scheduler.tick(T0)
        assert scheduler.leader
        lock.session = -1  # as if the pooler had lent another server connection
        scheduler.monotonic = lambda: LEASE
        await scheduler.tick(T0)
        assert not scheduler.leader and lock.connection is None  # and the session closed
    finally:
        await scheduler.close()


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
async def test_a_lock_taken_through_a_transaction_pooler_is_given_up(db, pgbouncer_url):
    """LISTEN_URL unset and DATABASE_URL a transaction pooler: the lock lands on whichever
    server connection the pooler lent, and the next statement may reach another."""
    settings = settings_for(db, database_url=pgbouncer_url, scheduler_lease_seconds=LEASE)
    lock = lock_for(settings)
    assert isinstance(lock, SessionLock)
    scheduler = Scheduler(lock, [], lease=LEASE, worker_id="a", monotonic=lambda: 0.0)
    pooled = make_engine(pgbouncer_url, null_pool=True)
    try:
        await scheduler.tick(T0)
        assert scheduler.leader
        taken_on = lock.session
        with pooled.connect() as other:  # another client's transaction pins that server
            pinned = other.execute(text("SELECT pg_backend_pid()")).scalar_one()
            assert pinned == taken_on  # the pooler lends its idle server connection first
            scheduler.monotonic = lambda: LEASE
            await scheduler.tick(T0)
        assert not scheduler.leader and lock.connection is None
    finally:
        await scheduler.close()
        pooled.dispose()
        # The lock stays on the pooler's server connection (nothing resets it in
        # transaction mode): end that session so later tests start free.
        with db.engine.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND classid = 1835100524 AND database ="
                    " (SELECT oid FROM pg_database WHERE datname = current_database())"
                )
            )


def side_task_failures(task: str) -> float:
    return REGISTRY.get_sample_value("mailbag_side_task_failures_total", {"task": task}) or 0.0


async def test_a_failing_job_fails_only_that_run_and_runs_again_when_next_due():
    # A bug in one scheduled job once stopped the worker, and with it all mail.
    ticks, calls = Ticks(), []

    async def flaky(now: datetime) -> Mapping[str, int]:
        calls.append(now)
        if len(calls) == 1:
            raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))
        if len(calls) == 3:
            raise ValueError("a bug")
        if len(calls) == 4:
            raise UnicodeError("another kind of bug")
        return {"done": 1}

    scheduler = Scheduler(
        OnlyProcess(),
        [PeriodicJob("flaky", 1.0, flaky)],
        lease=LEASE,
        worker_id="a",
        monotonic=ticks,
    )
    bugs_before = side_task_failures("flaky")
    try:
        for at in (0.0, 1.0, 2.0, 3.0, 4.0):
            ticks.at = at
            await scheduler.tick(T0)  # never raises: the job's failures are its own
            await settle()
        assert len(calls) == 5 and scheduler.leader and leader_gauge() == 1
    finally:
        await scheduler.close()
    # The two bugs are counted; a database error is the database's, logged only.
    assert side_task_failures("flaky") - bugs_before == 2
    assert leader_gauge() == 0


def test_each_database_gets_its_own_lock(tmp_path):
    from mailbag.settings import Settings

    memory = Settings(database_url="sqlite://")
    assert isinstance(lock_for(memory), OnlyProcess)
    on_file = lock_for(Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}"))
    assert isinstance(on_file, FileLock) and on_file.path == tmp_path / "x.db-scheduler"
    # Behind PgBouncer: DATABASE_URL is the pooler, the lock session goes to LISTEN_URL.
    pooled = Settings(
        database_url="postgresql://app@pgbouncer:6432/mail",
        listen_url="postgresql://app@db:5432/mail",
    )
    direct = lock_for(pooled)
    assert isinstance(direct, SessionLock) and direct.engine.url.host == "db"
    assert mysql_lock_name("shop") == "mailbag.scheduler.shop"
    long = mysql_lock_name("d" * 64)
    assert len(long) <= 64 and long != mysql_lock_name("e" * 64)


def test_the_purge_job_runs_even_when_purge_after_days_is_zero(tmp_path):
    # A tenant may have its own PURGE_AFTER_DAYS (tests/test_erasure.py shows the purge).
    from mailbag.settings import Settings

    url = f"sqlite:///{tmp_path / 'x.db'}"
    engine: Any = None  # the jobs only capture it
    on = maintenance_jobs(Settings(database_url=url, purge_after_days=30), engine)
    off = maintenance_jobs(Settings(database_url=url, purge_after_days=0), engine)
    others = [
        "sender_domains_checked",
        "idempotency_records_expired",
        "verifications_expired",
        "recipient_domains_forgotten",
    ]
    assert [job.name for job in on] == ["purged", *others]
    assert [job.name for job in off] == ["purged", *others]


# --- housekeeping ----------------------------------------------------------------------


def add_record(db: TestDB, key: str, expires_at: datetime) -> None:
    with db.engine.begin() as conn:
        conn.execute(
            insert(idempotency_records).values(
                tenant_id="t",
                idempotency_key=key,
                operation="POST /v1/messages",
                fingerprint="0" * 64,
                created_at=T0 - timedelta(days=2),
                expires_at=expires_at,
            )
        )


def add_verification(db: TestDB, state: VState, expires_at: datetime) -> uuid.UUID:
    values = {
        "id": uuid.uuid4(),
        "tenant_id": "t",
        "email": f"{uuid.uuid4().hex[:8]}@example.com",
        "token_digest": "0" * 64,
        "expires_at": expires_at,
        "message_id": None,
        "template_name": "verify",
        "redirect_url": None,
    }
    with db.engine.begin() as conn:
        run(conn, verification_store.create(values, now=T0 - timedelta(days=2), actor="api"))
        if state is not VState.CREATED:
            conn.execute(
                update(email_verifications)
                .where(email_verifications.c.id == values["id"])
                .values(state=state.value)
            )
    return values["id"]


def states(db: TestDB) -> dict[uuid.UUID, str]:
    with db.engine.connect() as conn:
        rows = conn.execute(select(email_verifications.c.id, email_verifications.c.state))
        return {row.id: row.state for row in rows}


def set_status(db: TestDB, ids: list[Any], status: str, updated_at: datetime) -> None:
    with db.engine.begin() as conn:
        conn.execute(
            update(outbox_messages)
            .where(outbox_messages.c.id.in_(ids))
            .values(status=status, updated_at=updated_at)
        )


async def test_the_scheduled_housekeeping_purges_drops_and_expires_in_chunks(
    db, async_engine, monkeypatch
):
    monkeypatch.setattr(maintenance, "CHUNK", 2)  # several chunks from a handful of rows
    now = T0
    old, recent, unknown = enqueue(db, 5), enqueue(db, 1), enqueue(db, 1)
    set_status(db, [m.id for m in old], "sent", now - timedelta(days=31))
    set_status(db, [m.id for m in recent], "sent", now - timedelta(days=29))
    set_status(db, [m.id for m in unknown], "unknown", now - timedelta(days=90))
    for i in range(5):
        add_record(db, f"old-{i}", now - timedelta(seconds=1))
    add_record(db, "live", now + timedelta(hours=1))
    stale = [add_verification(db, state, now - timedelta(minutes=1)) for state in VState]
    fresh = add_verification(db, VState.SENT, now + timedelta(minutes=10))

    purged = await maintenance.purge_finished(async_engine, older_than=now - timedelta(days=30))
    dropped = await maintenance.drop_expired_records(async_engine, now)
    expired = await maintenance.expire_verifications(async_engine, now)

    assert purged == {"messages": 5, "attachments": 0}
    assert dropped == {"records": 5}
    unfinished = {VState.CREATED, VState.SEND_PENDING, VState.SENT, VState.SEND_FAILED}
    assert expired == {"verifications": len(unfinished)}
    with db.engine.connect() as conn:
        kept = conn.execute(select(outbox_messages.c.id)).scalars().all()
        keys = conn.execute(select(idempotency_records.c.idempotency_key)).scalars().all()
        by = conn.execute(
            select(verification_events.c.actor, func.count())
            .where(verification_events.c.to_state == "expired")
            .group_by(verification_events.c.actor)
        ).all()
    assert sorted(map(str, kept)) == sorted(str(m.id) for m in recent + unknown)
    assert keys == ["live"]
    after = states(db)
    assert [after[v] for v in stale] == [
        "expired" if state in unfinished else state.value for state in VState
    ]
    assert after[fresh] == "sent"
    assert [tuple(row) for row in by] == [("scheduler", len(unfinished))]
    # Run again: nothing is left to do, and nothing that should stay has moved.
    assert await maintenance.expire_verifications(async_engine, now) == {"verifications": 0}


# --- replicas as processes -------------------------------------------------------------

PROCESS_LEASE = 2.0


def worker_log(path: Path) -> list[dict[str, Any]]:
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return lines


def events(path: Path, name: str) -> list[dict[str, Any]]:
    return [line for line in worker_log(path) if line.get("event") == name]


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def leaders(logs: list[Path]) -> list[int]:
    return [i for i, log in enumerate(logs) if events(log, "scheduler_leader_gained")]


def stamp(line: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00"))


def records_left(db: TestDB) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(idempotency_records)).scalar_one())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("db", "route"),
    [
        ("postgresql", "direct"),
        ("postgresql", "pgbouncer"),
        ("mysql", "direct"),
        ("sqlite", "file"),
    ],
    indirect=["db"],
)
def test_worker_processes_elect_one_scheduler_and_replace_it_when_killed(
    db, route, tmp_path, request, record_property
):
    """SQLite: two workers on one file (a worker beside `serve`); the servers: three.
    PgBouncer: DATABASE_URL through the transaction pooler, LISTEN_URL (and with it the
    lock session) direct, as fleets deploy it."""
    replicas = 2 if db.dialect == "sqlite" else 3
    add_record(db, "stale", datetime.now(UTC) - timedelta(minutes=1))
    # PgBouncer: the replicas' queries through the pooler; LISTEN and the lock direct.
    url, direct = (
        (request.getfixturevalue("pgbouncer_url"), {"listen_url": db.url})
        if route == "pgbouncer"
        else (db.url, {})
    )
    env = mailbag_env(
        url,
        **direct,
        provider="file",
        file_dir=str(tmp_path / "mail"),
        log_level="INFO",
        poll_interval="0.2",
        scheduler_lease_seconds=str(PROCESS_LEASE),
        maintenance_every_seconds="0.5",
        reconcile_every_seconds="0.5",
    )
    logs = [tmp_path / f"w{i}.log" for i in range(replicas)]
    workers: list[subprocess.Popen[Any] | None] = [
        start_mailbag("worker", env={**env, "MAILBAG_WORKER_ID": f"w{i}"}, stderr=log.open("ab"))
        for i, log in enumerate(logs)
    ]
    try:
        first = wait_for(lambda: leaders(logs), 30, "a scheduler")
        wait_for(lambda: records_left(db) == 0, 10, "the stale idempotency record dropped")
        time.sleep(PROCESS_LEASE + 0.5)  # every replica has tried to lead since
        assert leaders(logs) == first and len(first) == 1
        leader = first[0]
        ran = [len(events(log, "scheduled_job_done")) for log in logs]
        assert ran[leader] >= 3 * 4  # four jobs every half second, for seconds
        assert [n for i, n in enumerate(ran) if i != leader] == [0] * (replicas - 1)

        process = workers[leader]
        assert process is not None
        stop(process, signal.SIGKILL)
        killed_at = datetime.now(UTC)
        workers[leader] = None
        successors = wait_for(
            lambda: [i for i in leaders(logs) if i != leader], 10, "another scheduler"
        )
        assert len(successors) == 1
        gained = stamp(events(logs[successors[0]], "scheduler_leader_gained")[0])
        takeover = (gained - killed_at).total_seconds()
        record_property("takeover_seconds", round(takeover, 3))  # --junitxml shows it
        # Within a lease, give or take the followers' tick (a third of a lease at most).
        assert takeover < PROCESS_LEASE + PROCESS_LEASE / 3 + 0.5
        add_record(db, "stale-2", datetime.now(UTC) - timedelta(minutes=1))
        wait_for(lambda: records_left(db) == 0, 10, "the new scheduler at work")
        others = [i for i in range(replicas) if i not in (leader, successors[0])]
        assert all(not events(logs[i], "scheduled_job_done") for i in others)
    finally:
        codes = [stop(w) for w in workers if w is not None]
    assert codes == [0] * (replicas - 1), logs[0].read_text()[-2000:]
