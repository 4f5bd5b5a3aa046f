"""Failover between providers with real processes: `mailbag worker` with two SMTP providers
(`[providers.primary]`, `[providers.backup]`, one route), each a real SMTP server (aiosmtpd).

- a primary that refuses connections: every message is sent once, by the backup;
- a primary that takes the content and drops the connection before answering: every
  message is `unknown`, and the backup never gets one (it might have been delivered);
- a primary whose breaker opens while it is down and closes once it is back.
Every message is counted by Message-ID at the servers.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from mailbag.store.schema import outbox_messages, provider_health
from servers import mailbag_env, stop
from test_worker_processes import counts, delivered_ids, enqueue_many, start_worker, wait_for

from conftest import TestDB
from smtp_server import DROP, RecordingSMTPServer

pytestmark = pytest.mark.slow

TOTAL = 30


def fleet_env(
    db: TestDB, primary: RecordingSMTPServer, backup: RecordingSMTPServer, **extra: str
) -> dict[str, str]:
    smtp = {"kind": "smtp", "host": "127.0.0.1", "tls": "none"}
    tables = {
        "primary": {**smtp, "port": primary.port},
        "backup": {**smtp, "port": backup.port},
    }
    return mailbag_env(
        db.url,
        providers=json.dumps(tables),
        routes=json.dumps([{"providers": ["primary", "backup"]}]),
        poll_interval="0.2",
        batch_size="10",
        concurrency="8",
        **extra,
    )


def sent_by(db: TestDB) -> dict[str, int]:
    with db.engine.connect() as conn:
        rows = conn.execute(select(outbox_messages.c.provider, outbox_messages.c.attempt_count))
        found: dict[str, int] = {}
        for provider, attempts in rows:
            assert attempts == 1  # failover spent no attempt
            found[provider] = found.get(provider, 0) + 1
        return found


def health(db: TestDB, name: str) -> Any:
    with db.engine.connect() as conn:
        query = select(provider_health).where(provider_health.c.name == name)
        return conn.execute(query).one_or_none()


@pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)
def test_a_primary_that_refuses_connections_leaves_every_message_to_the_backup_once(
    db, tmp_path: Path
) -> None:
    enqueue_many(db, TOTAL)
    with RecordingSMTPServer() as primary, RecordingSMTPServer() as backup:
        primary.stop()  # its port now refuses connections
        worker = start_worker(fleet_env(db, primary, backup), tmp_path / "w.log")
        try:
            wait_for(lambda: counts(db).get("sent", 0) == TOTAL, 60, "every message sent")
        finally:
            code = stop(worker)
        assert code == 0, (tmp_path / "w.log").read_text()[-2000:]
        delivered = delivered_ids(backup)
    assert len(delivered) == TOTAL and set(delivered.values()) == {1}
    assert sent_by(db) == {"backup": TOTAL}
    # Five refusals in a row opened its breaker: the rest went straight to the backup.
    row = health(db, "primary")
    assert row is not None and row.failures_in_row >= 5 and row.open_until is not None
    assert row.last_error and "connect" in row.last_error.lower()


@pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)
def test_a_primary_that_drops_the_connection_after_the_content_leaves_the_message_unknown(
    db, tmp_path: Path
) -> None:
    enqueue_many(db, 5)
    with RecordingSMTPServer() as primary, RecordingSMTPServer() as backup:
        primary.inject("end_of_data", DROP, times=None)
        worker = start_worker(fleet_env(db, primary, backup), tmp_path / "w.log")
        try:
            wait_for(lambda: counts(db).get("unknown", 0) == 5, 60, "every message unknown")
        finally:
            code = stop(worker)
        assert code == 0, (tmp_path / "w.log").read_text()[-2000:]
        assert len(primary.arrived) == 5  # its content reached the primary, maybe delivered
        assert backup.arrived == []  # so the backup must never send it again
    assert counts(db) == {"unknown": 5}
    assert sent_by(db) == {"primary": 5}


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_the_primarys_breaker_opens_while_it_is_down_and_closes_once_it_is_back(
    db, tmp_path: Path
) -> None:
    enqueue_many(db, TOTAL)
    with RecordingSMTPServer() as primary, RecordingSMTPServer() as backup:
        primary.stop()
        env = fleet_env(db, primary, backup, provider_breaker_seconds="1")
        worker = start_worker(env, tmp_path / "w.log")
        try:
            wait_for(lambda: counts(db).get("sent", 0) == TOTAL, 60, "the first messages sent")

            def opened() -> bool:  # the refusals are written at the worker's next exchange
                found = health(db, "primary")
                return found is not None and found.open_until is not None

            wait_for(opened, 30, "the breaker opened")
            primary.start()  # back on the same port: the next probe gets through

            def closed_while_mail_flows() -> bool:
                enqueue_many(db, 2)  # a probe needs a message to go
                return bool(health(db, "primary").failures_in_row == 0)

            wait_for(closed_while_mail_flows, 60, "the breaker closed", step=0.5)
            before = len(delivered_ids(primary))
            total = sum(counts(db).values()) + TOTAL
            enqueue_many(db, TOTAL)
            wait_for(lambda: counts(db).get("sent", 0) == total, 60, "every message sent")
        finally:
            code = stop(worker)
        assert code == 0, (tmp_path / "w.log").read_text()[-2000:]
        by_primary, by_backup = delivered_ids(primary), delivered_ids(backup)
    assert not set(by_primary) & set(by_backup)  # never both
    assert len(by_primary) + len(by_backup) == total
    assert set(by_primary.values()) <= {1} and set(by_backup.values()) <= {1}
    assert len(by_primary) - before >= TOTAL  # closed, the primary has all the mail again
    assert health(db, "primary").open_until is None


def test_a_table_that_cannot_work_stops_the_worker_at_start_naming_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    cases = {
        json.dumps({"main": {"kind": "nope"}}): "providers.main.kind: no provider 'nope'",
        json.dumps({"main": {"kind": "postmark"}}): "providers.main.api_key: postmark cannot",
        json.dumps({"main": {"kind": "smtp", "prot": 25}}): "providers.main.prot: not a setting",
    }
    for tables, expected in cases.items():
        env = mailbag_env(url, providers=tables, routes="[]")
        done = subprocess.run(
            [*start_command(), "worker"], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode != 0
        assert expected in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    secret = "pm-key-that-must-not-show"
    tables = json.dumps({"main": {"kind": "postmark", "api_key": secret, "timeout": "soon"}})
    env = mailbag_env(url, providers=tables)
    done = subprocess.run(
        [*start_command(), "worker"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "providers.main.timeout:" in done.stderr
    assert secret not in done.stderr
    routes = json.dumps([{"providers": ["main", "backup"]}])
    env = mailbag_env(url, providers=json.dumps({"main": {"kind": "console"}}), routes=routes)
    done = subprocess.run(
        [*start_command(), "worker"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "routes[1].providers: no [providers.backup] table (configured: main)" in done.stderr


def start_command() -> list[str]:
    import sys

    return [sys.executable, "-m", "mailbag"]
