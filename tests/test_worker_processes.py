"""Worker replicas as real processes, sending to a real SMTP server (aiosmtpd).

Races between replicas, SIGKILL at random moments, a database restart, and a SIGTERM
drain. Every claim is checked where it matters: Message-IDs counted at the SMTP server.
The races, the kills and the NOTIFY wake-up also run through PgBouncer in transaction mode
(`route` "pgbouncer": DATABASE_URL through it, LISTEN_URL direct), as fleets deploy it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from mailbag.compose import message_id_from_rfc
from mailbag.domain.states import Status
from mailbag.store import enqueue as enqueue_store
from mailbag.store import messages as message_store
from mailbag.store.database import make_engine
from mailbag.store.plan import run
from mailbag.store.schema import message_events, outbox_messages
from servers import mailbag_env, start_mailbag, stop

from conftest import IN_CI, TestDB
from helpers import message
from smtp_server import RecordingSMTPServer

pytestmark = pytest.mark.slow


def enqueue_many(db: TestDB, n: int) -> None:
    batch = [message(i) for i in range(n)]
    with db.engine.begin() as conn:
        for start in range(0, n, 1000):
            run(
                conn,
                enqueue_store.enqueue(
                    batch[start : start + 1000], now=store_now(), default_max_attempts=5
                ),
            )


def store_now() -> Any:
    from mailbag.clock import utcnow

    return utcnow()


def counts(db: TestDB) -> dict[str, int]:
    with db.engine.connect() as conn:
        return run(conn, message_store.count_by_status())


def routed(db: TestDB, request: pytest.FixtureRequest, route: str) -> dict[str, str]:
    """The worker's database settings: straight to the server, or through PgBouncer with
    LISTEN on a direct connection beside it."""
    if route == "direct":
        return {}
    assert route == "pgbouncer"
    return {"database_url": request.getfixturevalue("pgbouncer_url"), "listen_url": db.url}


def worker_env(db: TestDB, smtp: RecordingSMTPServer, **settings: str) -> dict[str, str]:
    database_url = settings.pop("database_url", db.url)
    base = {
        "provider": "smtp",
        "smtp_host": smtp.host,
        "smtp_port": str(smtp.port),
        "smtp_tls": "none",
        "poll_interval": "0.2",
        "batch_size": "50",
        "concurrency": "16",
    }
    return mailbag_env(database_url, **{**base, **settings})


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[Any]:
    return start_mailbag("worker", env=env, stdout=subprocess.DEVNULL, stderr=log.open("ab"))


def wait_for(condition: Any, timeout: float, what: str, step: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


def delivered_ids(smtp: RecordingSMTPServer) -> Counter[Any]:
    return Counter(message_id_from_rfc(mid) for mid in smtp.message_ids() if mid)


@pytest.mark.parametrize(
    ("db", "route"),
    [("postgresql", "direct"), ("mysql", "direct"), ("postgresql", "pgbouncer")],
    indirect=["db"],
)
def test_four_workers_deliver_every_message_exactly_once(db, route, request, tmp_path):
    total = 2500 if route == "direct" else 1000  # the same race, in less of the suite's time
    enqueue_many(db, total)
    with RecordingSMTPServer() as smtp:
        env = worker_env(db, smtp, **routed(db, request, route))
        workers = [start_worker(env, tmp_path / f"w{i}.log") for i in range(4)]
        try:
            wait_for(lambda: counts(db).get("sent", 0) == total, 240, "every message sent")
        finally:
            codes = [stop(w) for w in workers]
        assert codes == [0, 0, 0, 0], (tmp_path / "w0.log").read_text()[-2000:]
        arrived = delivered_ids(smtp)
    assert len(arrived) == total
    assert [mid for mid, n in arrived.items() if n > 1] == []
    assert counts(db) == {"sent": total}
    with db.engine.connect() as conn:
        senders = (
            conn.execute(
                select(message_events.c.actor)
                .where(message_events.c.to_status == Status.SENT.value)
                .distinct()
            )
            .scalars()
            .all()
        )
    assert len(senders) == 4  # every replica took part: the race was real


@pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)
def test_another_tenants_message_passes_a_backlog_with_several_workers(db, tmp_path):
    # Fair queues (issue 25): tenant B's one message goes in the next claims, not after
    # tenant A's backlog; what is left of the backlog when it was sent says so.
    enqueue_many(db, 3000)
    with RecordingSMTPServer() as smtp:
        env = worker_env(db, smtp)
        workers = [start_worker(env, tmp_path / f"w{i}.log") for i in range(3)]
        try:
            wait_for(lambda: counts(db).get("sent", 0) >= 100, 120, "the backlog moving")
            b = message(0, tenant_id="tenant-b")
            with db.engine.begin() as conn:
                run(conn, enqueue_store.enqueue([b], now=store_now(), default_max_attempts=5))
            unsent_then = 3000 - counts(db).get("sent", 0)

            def b_sent() -> bool:
                query = select(outbox_messages.c.status).where(
                    outbox_messages.c.tenant_id == "tenant-b"
                )
                with db.engine.connect() as conn:
                    return conn.execute(query).scalar_one() == Status.SENT.value

            wait_for(b_sent, 60, "tenant B's message sent", step=0.02)
            unsent_when_b_sent = 3000 - counts(db).get("sent", 0)
        finally:
            codes = [stop(w) for w in workers]
        assert codes == [0, 0, 0], (tmp_path / "w0.log").read_text()[-2000:]
    assert unsent_when_b_sent > unsent_then / 2, (unsent_then, unsent_when_b_sent)


@pytest.mark.parametrize("route", ["direct", "pgbouncer"])
@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_killed_workers_never_cause_a_duplicate(db, route, request, tmp_path):
    """SIGKILL at random moments, restarts, a short lease: nothing lost, nothing sent twice,
    and `unknown` only for messages a killed worker held."""
    total = 2000 if route == "direct" else 1000
    enqueue_many(db, total)
    rng = random.Random(20261130)
    with RecordingSMTPServer() as smtp:
        smtp.reply_delay = 0.005
        env = worker_env(
            db,
            smtp,
            lease_seconds="2",
            concurrency="8",
            batch_size="20",
            **routed(db, request, route),
        )
        workers = [start_worker(env, tmp_path / "workers.log") for _ in range(3)]
        killed: set[str] = set()
        host = os.uname().nodename
        try:
            deadline = time.monotonic() + 180
            kills = 0
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.3, 1.2))
                left = counts(db)
                if (
                    not left.get("pending")
                    and not left.get("retrying")
                    and not left.get("processing")
                ):
                    break
                if kills < 6:
                    victim = rng.randrange(len(workers))
                    killed.add(f"{host}:{workers[victim].pid}")
                    stop(workers[victim], signal.SIGKILL)
                    workers[victim] = start_worker(env, tmp_path / "workers.log")
                    kills += 1
            assert kills >= 3, "the run ended before the workers could be killed"
        finally:
            for worker in workers:
                stop(worker)
        final = counts(db)
        arrived = delivered_ids(smtp)

    assert set(final) <= {"sent", "failed", "dead", "unknown"}, final
    assert sum(final.values()) == total
    assert [mid for mid, n in arrived.items() if n > 1] == []
    with db.engine.connect() as conn:
        rows = conn.execute(
            select(outbox_messages.c.id, outbox_messages.c.status, outbox_messages.c.claimed_by)
        ).all()
    sent = {r.id for r in rows if r.status == Status.SENT}
    assert sent <= set(arrived)  # what we call sent did arrive
    unknown = [r for r in rows if r.status == Status.UNKNOWN]
    assert all(r.claimed_by in killed for r in unknown), "unknown only where a worker died"
    assert final.get("sent", 0) >= total - 8 * len(killed)


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_an_enqueue_wakes_an_idle_worker_at_once(db, request, tmp_path):
    """LISTEN/NOTIFY across processes, with DATABASE_URL through PgBouncer and LISTEN_URL
    direct: the poll is 30 s away, the send comes within a second. The enqueues go through
    PgBouncer, as the API's do."""
    settings = routed(db, request, "pgbouncer")
    enqueuer = make_engine(settings["database_url"], pool_size=1, statement_timeout=5)
    with RecordingSMTPServer() as smtp:
        env = worker_env(db, smtp, poll_interval="30", **settings)
        log = tmp_path / "worker.log"
        worker = start_worker(env, log)
        latencies = []
        try:
            enqueue_into(enqueuer, 1)
            wait_for(lambda: counts(db).get("sent", 0) == 1, 30, "the worker to start")
            time.sleep(1)  # its listener connected and probed (LISTEN_URL is direct)
            for n in range(2, 6):
                started = time.monotonic()
                enqueue_into(enqueuer, 1)
                wait_for(lambda n=n: counts(db).get("sent", 0) == n, 10, f"email {n}", step=0.01)
                latencies.append(time.monotonic() - started)
        finally:
            code = stop(worker)
            enqueuer.dispose()
        assert code == 0
    assert max(latencies) < 2, latencies  # not the 30 s poll
    assert "listen_not_working" not in log.read_text()


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_listen_through_a_transaction_pooler_is_a_clear_warning(db, pgbouncer_url, tmp_path):
    """DATABASE_URL at PgBouncer and no LISTEN_URL: LISTEN is accepted and never hears a
    thing. The worker says so at start (and still delivers, by polling)."""
    enqueue_many(db, 3)
    with RecordingSMTPServer() as smtp:
        env = worker_env(db, smtp, database_url=pgbouncer_url, poll_interval="0.5")
        log = tmp_path / "worker.log"
        worker = start_worker(env, log)
        try:
            wait_for(lambda: "listen_not_working" in log.read_text(), 30, "the warning")
            wait_for(lambda: counts(db).get("sent", 0) == 3, 30, "delivery by polling")
        finally:
            code = stop(worker)
    assert code == 0
    warning = next(
        json.loads(line) for line in log.read_text().splitlines() if "listen_not_working" in line
    )
    assert warning["level"] == "warning" and "LISTEN_URL" in warning["hint"]
    assert warning["listen_url"] == pgbouncer_url


def enqueue_into(engine: Any, n: int) -> None:
    with engine.begin() as conn:
        run(
            conn,
            enqueue_store.enqueue(
                [message(i) for i in range(n)], now=store_now(), default_max_attempts=5
            ),
        )


@pytest.mark.stops_database
@pytest.mark.parametrize("route", ["direct", "pgbouncer"])
@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_the_worker_rides_out_a_database_restart(db, route, request, tmp_path):
    cluster = _local_postgres_cluster(db)
    total = 600
    enqueue_many(db, total)
    with RecordingSMTPServer() as smtp:
        smtp.reply_delay = 0.01
        env = worker_env(
            db,
            smtp,
            concurrency="8",
            batch_size="20",
            database_timeout_seconds="1",
            **routed(db, request, route),
        )
        worker = start_worker(env, tmp_path / "worker.log")
        try:
            wait_for(lambda: counts(db).get("sent", 0) >= 100, 60, "the run to get going")
            # Sends in flight when the server goes down, whose outcomes must then wait for
            # it: that the outage is felt is decided here, not by timing.
            smtp.hold_replies()
            wait_for(lambda: smtp.held >= 1, 30, "a send held at the relay", step=0.02)
            _pg_ctl(cluster, "stop")  # fast shutdown: every connection is cut
            smtp.release_replies()
            # The held sends finish now; recording them fails (at once, or at the 1 s
            # database bound behind PgBouncer, which queues them) until the server is back.
            wait_for(
                lambda: "finalize_failed" in (tmp_path / "worker.log").read_text(),
                30,
                "a finalize during the outage",
                step=0.1,
            )
            _pg_ctl(cluster, "start")
            db.engine.dispose()
            wait_for(lambda: counts(db).get("sent", 0) == total, 120, "every message sent")
        finally:
            code = stop(worker)
        assert code == 0
        arrived = delivered_ids(smtp)
    assert len(arrived) == total and max(arrived.values()) == 1
    assert counts(db) == {"sent": total}


def sqlite_db(path: Path) -> Any:
    """A migrated SQLite file shaped like the `db` fixture (url, dialect, engine)."""
    from mailbag.store import migrate
    from mailbag.store.database import dialect_of, make_engine

    url = f"sqlite:///{path}"
    engine = make_engine(url)
    migrate.upgrade(engine)

    class DB:
        pass

    db = DB()
    db.engine, db.url, db.dialect = engine, url, dialect_of(url)  # type: ignore[attr-defined]
    return db


def test_sigterm_lets_sends_finish_and_exits_zero(tmp_path):
    db = sqlite_db(tmp_path / "drain.db")
    engine = db.engine
    enqueue_many(db, 6)
    with RecordingSMTPServer() as smtp:
        smtp.reply_delay = 1.5
        env = worker_env(db, smtp, concurrency="2", batch_size="2", shutdown_grace="10")
        worker = start_worker(env, tmp_path / "worker.log")
        wait_for(
            lambda: counts(db).get("processing", 0) == 2 and len(smtp.arrived) == 0,
            30,
            "two sends in flight",
        )
        time.sleep(0.5)
        started = time.monotonic()
        assert stop(worker, signal.SIGTERM) == 0
        assert time.monotonic() - started < 10
        arrived = delivered_ids(smtp)
    assert len(arrived) == 2
    final = counts(db)
    assert final == {"sent": 2, "pending": 4}
    with engine.connect() as conn:
        attempts = conn.execute(
            select(func.max(outbox_messages.c.attempt_count)).where(
                outbox_messages.c.status == "pending"
            )
        ).scalar_one()
    assert attempts == 0


def _local_postgres_cluster(db: TestDB) -> str:
    """The local cluster behind the test URL, which this test may stop and start."""
    clusters = Path("/etc/postgresql")
    local = "127.0.0.1" in db.url or "localhost" in db.url
    usable = bool(shutil.which("pg_ctlcluster")) and clusters.is_dir() and os.geteuid() == 0
    if not (usable and local):
        if IN_CI:
            pytest.fail("CI needs a local PostgreSQL cluster it can restart (pg_ctlcluster)")
        pytest.skip("no local PostgreSQL cluster to restart")
    return sorted(p.name for p in clusters.iterdir())[0]


def _pg_ctl(version: str, action: str) -> None:
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True,
        capture_output=True,
    )
    if action == "start":
        for _ in range(60):
            if subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1"], check=False).returncode == 0:
                return
            time.sleep(0.5)
        raise AssertionError("PostgreSQL did not come back")


BROKEN_FINALIZER = """
from mailbag.worker.database import WorkerDatabase

async def broken(self, batch):
    raise RuntimeError("injected finalizer bug")

WorkerDatabase.finalize = broken
from mailbag.cli import app

app(prog_name="mailbag", args=["worker"])
"""


def test_a_worker_whose_finalizer_dies_exits_non_zero_and_says_why(tmp_path):
    """A supervisor sees the exit status; the operator sees one line naming the helper."""
    db = sqlite_db(tmp_path / "broken.db")
    enqueue_many(db, 3)
    env = mailbag_env(db.url, provider="file", file_dir=str(tmp_path / "mail"), poll_interval="0.1")
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, "-c", BROKEN_FINALIZER],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,
    )
    try:
        code = worker.wait(timeout=30)
    finally:
        stop(worker)
    assert code == 1
    lines = log.read_text().splitlines()
    assert '"event": "worker_helper_died"' in lines[0] and "mailbag-finalizer" in lines[0]
    assert lines[-1].startswith("mailbag: the worker's mailbag-finalizer task died")
    # Its sends stay `processing` for a sweep to judge once their lease ends (no one renews
    # it); what it had not started went back to `pending`.
    sent = len(list((tmp_path / "mail").glob("*.eml")))
    assert counts(db) == {"processing": sent, "pending": 3 - sent} or counts(db) == {
        "processing": 3
    }
