"""Erasure of one person's data, on each database, proven by a dump of the whole database
(pg_dump, mariadb-dump, the SQLite file and its write-ahead log read as bytes): the address
(in any case) and its local part are nowhere after it; the address stays suppressed by its
keyed hash, and an operator can lift that by the address. Bad input writes nothing.
Also: each tenant's own PURGE_AFTER_DAYS."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from api_helpers import TEST_SECRET_KEY, api_client, new_tenant
from mailbag.cli import app as cli_app
from mailbag.clock import utcnow
from mailbag.domain.erasure import PLACEHOLDER
from mailbag.services import maintenance
from mailbag.services.erasure import erasure_key
from mailbag.store.schema import (
    erasures,
    hook_deliveries,
    idempotency_records,
    message_events,
    metadata,
    outbox_messages,
    provider_events,
    suppressions,
)

from conftest import TestDB

ADMIN_TOKEN = "admin-token-erasure-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PERSON = "Zelda.Quist@Example.com"  # as an application wrote it
LOCAL = "zelda.quist"
OTHER = "olaf@example.com"
ATTACHMENT = b"%PDF-1.4 statement of zelda.quist %%EOF"
runner = CliRunner()


# --- the dump of a whole database, as bytes ------------------------------------------


def dump(db: TestDB) -> bytes:
    """Everything the database holds, as an outsider reading its backup would see it."""
    url = make_url(db.url)
    if db.dialect == "sqlite":
        db.engine.dispose()  # pooled connections keep nothing, but let the WAL be read as is
        path = Path(str(url.database))
        wal = path.with_name(path.name + "-wal")
        return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")
    if db.dialect == "postgresql":
        return subprocess.run(
            ["pg_dump", "--no-owner", url.render_as_string(hide_password=False)],
            check=True,
            capture_output=True,
        ).stdout
    binary = "mariadb-dump" if _has("mariadb-dump") else "mysqldump"
    args = [binary, "-h", url.host or "127.0.0.1", "-P", str(url.port or 3306)]
    args += ["-u", url.username or "root", "--skip-extended-insert", str(url.database)]
    if url.password:
        args.insert(1, f"--password={url.password}")
    return subprocess.run(args, check=True, capture_output=True).stdout


def _has(binary: str) -> bool:
    return subprocess.run(["which", binary], capture_output=True).returncode == 0


def traces(data: bytes) -> list[str]:
    """Which forms of the person's address a dump holds (any case; the local part)."""
    lowered = data.lower()
    forms = {PERSON.lower(), LOCAL}
    return sorted(form for form in forms if form.encode() in lowered)


# --- what mailbag holds about the person, through its real doors ----------------------


async def person_everywhere(db: TestDB, tenant_id: str, key: str) -> dict[str, Any]:
    """Messages to, cc'ing and about the person (template data, headers, bodies, an
    attachment, an Idempotency-Key), a verification, a suppression, provider events, a
    hook delivery, an error; and one message about someone else that must stay whole."""
    async with api_client(db, key) as api:
        welcome = await api.post(
            "/v1/messages",
            json={
                "to": {"address": PERSON, "name": "Zelda Quist"},
                "subject": f"Welcome {LOCAL}",
                "text": f"Hi {LOCAL}, your login is {PERSON}",
                "headers": {"X-Customer": LOCAL},
                "metadata": {"handle": LOCAL},
                "attachments": [
                    {"filename": "statement.pdf", "content": base64.b64encode(ATTACHMENT).decode()}
                ],
            },
            headers={"Idempotency-Key": f"welcome-{PERSON}"},
        )
        assert welcome.status_code == 201, welcome.text
        copied = await api.post(
            "/v1/messages",
            json={"to": OTHER, "cc": [PERSON.upper()], "subject": "Minutes", "text": "see cc"},
            headers={"Idempotency-Key": "minutes-1"},  # the first-use chain on PostgreSQL
        )
        assert copied.status_code == 201, copied.text
        other = await api.post(
            "/v1/messages", json={"to": OTHER, "subject": "Yours only", "text": "hello Olaf"}
        )
        assert other.status_code == 201, other.text
        verification = await api.post(
            "/v1/email-verifications",
            json={"email": PERSON.lower()},
            headers={"Idempotency-Key": "verify-1"},
        )
        assert verification.status_code in (201, 202), verification.text
    welcome_id = uuid.UUID(welcome.json()["id"])
    now = utcnow()
    with db.engine.begin() as conn:
        conn.execute(
            insert(provider_events),
            [
                {
                    "provider": "postmark",
                    "dedup_key": f"pm-{i}",
                    "kind": "bounced",
                    "bounce_type": "hard",
                    "provider_event": "HardBounce",
                    "occurred_at": now,
                    "received_at": now,
                    "message_id": message_id,
                    "tenant_id": None,
                    "recipient": PERSON,
                    "detail": f"550 {PERSON}: no such user",
                    "raw": {"Email": PERSON, "Description": f"mailbox {LOCAL} unknown"},
                }
                for i, message_id in enumerate((welcome_id, None))
            ],
        )
        conn.execute(
            insert(hook_deliveries).values(
                id=uuid.uuid4(),
                endpoint_id=uuid.uuid4(),
                tenant_id=tenant_id,
                event="sent",
                message_id=welcome_id,
                webhook_id="msg_1",
                payload=json.dumps({"to": PERSON, "subject": f"Welcome {LOCAL}"}),
                status="pending",
                attempts=0,
                max_attempts=8,
                next_attempt_at=now,
                created_at=now,
                updated_at=now,
            )
        )
        conn.execute(
            insert(message_events).values(
                message_id=uuid.UUID(other.json()["id"]),
                from_status="processing",
                to_status="retrying",
                at=now,
                actor="worker-1",
                attempt=1,
                detail=f"421 try later (while sending to {PERSON.lower()})",
            )
        )
        conn.execute(
            insert(suppressions).values(
                tenant_id=tenant_id,
                email=PERSON.lower(),
                reason="hard_bounce",
                detail=f"550 {PERSON}",
                created_at=now,
            )
        )
    return {"welcome": welcome.json(), "other": other.json()}


def count(db: TestDB, table: Any, *where: Any) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one())


def rows_of_every_table(db: TestDB) -> dict[str, int]:
    return {table.name: count(db, table) for table in metadata.sorted_tables}


# --- the erasure --------------------------------------------------------------------


async def test_an_erasure_leaves_the_address_nowhere_in_a_dump_and_keeps_it_suppressed(db):
    tenant_id, key = new_tenant(db)
    made = await person_everywhere(db, tenant_id, key)
    assert traces(dump(db)) != []  # the proof can see the address when it is there
    before = rows_of_every_table(db)
    async with api_client(db, admin_token=ADMIN_TOKEN) as admin:
        erased = await admin.post("/v1/admin/erasures", json={"address": PERSON}, headers=AUTH)
        assert erased.status_code == 201, erased.text
        listed = await admin.get("/v1/admin/erasures", headers=AUTH)
        one = await admin.get(f"/v1/admin/erasures/{erased.json()['id']}", headers=AUTH)
    shown = erased.json()
    assert shown["state"] == "done" and shown["tenant_id"] is None and shown["held"] == 0
    assert shown["progress"]["outbox_messages"] == 3  # welcome, the cc'd one, the verification
    assert {"provider_events", "idempotency_records", "email_verifications"} <= set(
        shown["progress"]
    )
    assert [e["id"] for e in listed.json()] == [shown["id"]] and one.json() == shown
    assert PERSON.lower() not in (erased.text + listed.text).lower()

    assert traces(dump(db)) == []
    after = rows_of_every_table(db)
    # Skeletons stay: the rows are there, less the attachment nothing else carried, plus
    # one history row per erased message, the erasure's record, the hashed suppressions.
    assert after["outbox_messages"] == before["outbox_messages"]
    assert after["attachments"] == before["attachments"] - 1 == 0
    assert after["message_events"] >= before["message_events"] + 3
    assert after["erasures"] == 1
    with db.engine.connect() as conn:
        welcome = conn.execute(
            select(outbox_messages).where(outbox_messages.c.id == uuid.UUID(made["welcome"]["id"]))
        ).one()
        other = conn.execute(
            select(outbox_messages).where(outbox_messages.c.id == uuid.UUID(made["other"]["id"]))
        ).one()
        kept = conn.execute(select(suppressions.c.tenant_id, suppressions.c.email)).all()
        records = conn.execute(
            select(idempotency_records.c.id, idempotency_records.c.idempotency_key)
        ).all()
    assert welcome.to_address == PLACEHOLDER and welcome.subject is None
    assert welcome.status == "cancelled"  # it was pending: withdrawn, never sent
    assert welcome.template_data == {} and welcome.carried is None and welcome.headers == {}
    assert other.to_address == OTHER and other.subject == "Yours only"  # someone else's
    hashed = erasure_key_for_tests().hashed(PERSON)
    assert {(tenant_id, hashed), ("default", hashed)} <= set(kept)
    assert all(email.startswith("erased:") for _, email in kept)
    # Each key's stored answer quoted the person (as To, as Cc, as the verified address).
    # (its row's id: the ids go on from earlier tests on a server's database)
    assert len(records) == 3 and all(key == f"erased:{id_}" for id_, key in records)

    # Not mailed again, in any case, on each door: suppressed at enqueue.
    async with api_client(db, key) as api:
        again = await api.post(
            "/v1/messages",
            json={"to": PERSON.upper(), "subject": "Back?", "text": "hi"},
            headers={"Idempotency-Key": "back-1"},
        )
        plain = await api.post("/v1/messages", json={"to": PERSON, "subject": "s", "text": "t"})
    assert again.status_code == 201 and again.json()["status"] == "failed", again.text
    assert plain.json()["status"] == "failed"
    assert traces(dump(db)) != []  # (those two carry the address: a new message is new data)

    # An operator lifts the hashed suppression by the address.
    async with api_client(db, admin_token=ADMIN_TOKEN) as admin:
        lifted = await admin.delete(
            f"/v1/admin/suppressions/{tenant_id}/{PERSON.upper()}", headers=AUTH
        )
        assert lifted.status_code == 200, lifted.text
    async with api_client(db, key) as api:
        welcome_back = await api.post(
            "/v1/messages", json={"to": PERSON, "subject": "s", "text": "t"}
        )
    assert welcome_back.json()["status"] == "pending"


def erasure_key_for_tests() -> Any:
    """The key every replica of the test deployment hashes with (from its SECRET_KEY)."""
    from mailbag.settings import Settings

    settings = Settings.model_validate(
        {"database_url": "sqlite:///unused.db", "secret_key": TEST_SECRET_KEY}
    )
    key = erasure_key(settings)
    assert key is not None
    return key


async def test_an_erasure_of_one_tenant_leaves_the_other_tenants_alone(db):
    acme, acme_key = new_tenant(db, "acme")
    _, globex_key = new_tenant(db, "globex")
    for key in (acme_key, globex_key):
        async with api_client(db, key) as api:
            r = await api.post("/v1/messages", json={"to": PERSON, "subject": LOCAL, "text": "t"})
            assert r.status_code == 201
    async with api_client(db, admin_token=ADMIN_TOKEN) as admin:
        r = await admin.post(
            "/v1/admin/erasures", json={"address": PERSON, "tenant_id": "acme"}, headers=AUTH
        )
    assert r.status_code == 201 and r.json()["tenant_id"] == acme
    mentioning = func.lower(outbox_messages.c.to_address) == PERSON.lower()
    assert count(db, outbox_messages, mentioning) == 1  # globex's
    assert count(db, suppressions) == 1  # acme's hash only


async def test_a_message_a_worker_holds_waits_and_the_erasure_resumes_after_it(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        r = await api.post("/v1/messages", json={"to": PERSON, "subject": "s", "text": "t"})
    message_id = uuid.UUID(r.json()["id"])
    with db.engine.begin() as conn:  # as a claim leaves it
        conn.execute(
            update(outbox_messages)
            .where(outbox_messages.c.id == message_id)
            .values(status="processing", claim_token=uuid.uuid4(), claimed_by="w1")
        )
    async with api_client(db, admin_token=ADMIN_TOKEN) as admin:
        first = await admin.post("/v1/admin/erasures", json={"address": PERSON}, headers=AUTH)
        assert first.status_code == 202 and first.json()["state"] == "waiting"
        assert first.json()["held"] == 1
        with db.engine.begin() as conn:  # the worker finished: sent
            conn.execute(
                update(outbox_messages)
                .where(outbox_messages.c.id == message_id)
                .values(status="sent", claim_token=None)
            )
        second = await admin.post("/v1/admin/erasures", json={"address": PERSON}, headers=AUTH)
    assert second.status_code == 201 and second.json()["id"] == first.json()["id"]
    assert second.json()["state"] == "done"
    assert count(db, erasures) == 1
    assert traces(dump(db)) == []


def test_an_interrupted_erasure_continues_where_it_stopped(db, tmp_path):
    """A chunk of 1 message, the process killed after its first chunks, run again."""
    _, key = new_tenant(db)
    for i in range(6):
        asyncio_run(post_message(db, key, {"to": PERSON, "subject": f"{LOCAL} {i}", "text": "t"}))
    script = tmp_path / "erase_slowly.py"
    script.write_text(SLOW_ERASER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "ERASE_URL": db.url,
        "ERASE_KEY": TEST_SECRET_KEY,
    }
    child = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE)
    assert child.stdout is not None
    for _ in range(3):  # three chunks committed
        assert child.stdout.readline().strip() == b"chunk"
    child.send_signal(signal.SIGKILL)
    child.wait()
    with db.engine.connect() as conn:
        record = conn.execute(select(erasures)).one()
    # At least two chunks committed (the third may have been killed before its COMMIT),
    # and the count says exactly what was erased.
    mentioning = func.lower(outbox_messages.c.to_address) == PERSON.lower()
    left = count(db, outbox_messages, mentioning)
    assert record.state == "running" and 2 <= record.progress["outbox_messages"] < 6
    assert record.progress["outbox_messages"] == 6 - left

    result = runner.invoke(
        cli_app,
        ["erase", PERSON.lower(), "--json"],
        env={"MAILBAG_DATABASE_URL": db.url, "MAILBAG_SECRET_KEY": TEST_SECRET_KEY},
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["id"] == str(record.id) and shown["state"] == "done"
    assert shown["progress"]["outbox_messages"] == 6  # each message counted once
    assert count(db, outbox_messages, mentioning) == 0
    assert traces(dump(db)) == []


SLOW_ERASER = """
import asyncio, os, sys
from mailbag.services.erasure import Erasures, erasure_key
from mailbag.settings import Settings
from mailbag.store.database import make_async_engine
from mailbag.store import erasure as store

real = store.erase_messages

def announced(*args, **kwargs):
    done = yield from real(*args, **kwargs)
    print("chunk", flush=True)
    return done

store.erase_messages = announced

async def main():
    settings = Settings(database_url=os.environ["ERASE_URL"], secret_key=os.environ["ERASE_KEY"])
    engine = make_async_engine(settings.database_url)
    erasures = Erasures(engine, erasure_key(settings), chunk=1)
    real_chunk = erasures._chunk

    async def slowly(chunk, **args):
        full = await real_chunk(chunk, **args)
        await asyncio.sleep(0.3)  # time for the test to kill it between chunks
        return full

    erasures._chunk = slowly
    await erasures.run("zelda.quist@example.com", tenant=None, actor="operator:cli")

asyncio.run(main())
"""


def asyncio_run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


async def post_message(db: TestDB, key: str, body: dict[str, Any]) -> None:
    async with api_client(db, key) as api:
        r = await api.post("/v1/messages", json=body)
        assert r.status_code == 201, r.text


# --- bad input: a clear error, nothing written ---------------------------------------


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"address": "not an address"}, 422),
        ({"address": "zelda@"}, 422),
        ({"address": ""}, 422),
        ({"address": PERSON, "tenant_id": "t_nobody"}, 404),
        ({"address": PERSON, "extra": 1}, 422),
        ({}, 422),
    ],
)
async def test_bad_erasure_requests_are_problems_that_write_nothing(db, body, status):
    async with api_client(db, admin_token=ADMIN_TOKEN) as admin:
        r = await admin.post("/v1/admin/erasures", json=body, headers=AUTH)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert count(db, erasures) == 0 and count(db, suppressions) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["erase", "not an address"], "is not an email address"),
        (["erase", PERSON, "--tenant", "nobody"], "no tenant 'nobody'"),
    ],
)
def test_bad_erase_commands_exit_2_with_a_message_and_write_nothing(db, args, message):
    result = runner.invoke(
        cli_app,
        args,
        env={"MAILBAG_DATABASE_URL": db.url, "MAILBAG_SECRET_KEY": TEST_SECRET_KEY},
    )
    assert result.exit_code == 2 and message in result.output, result.output
    assert count(db, erasures) == 0 and count(db, suppressions) == 0


# --- each tenant's own PURGE_AFTER_DAYS -----------------------------------------------


async def test_each_tenant_keeps_its_finished_mail_as_long_as_its_retention_says(db):
    keeper, keeper_key = new_tenant(db, "keeper")
    _, brief_key = new_tenant(db, "brief")
    for key in (keeper_key, brief_key):
        await post_message(db, key, {"to": OTHER, "subject": "s", "text": "t"})
    now = utcnow()
    with db.engine.begin() as conn:  # finished 10 days ago
        conn.execute(
            update(outbox_messages).values(status="sent", updated_at=now - timedelta(days=10))
        )
    async with api_client(db, admin_token=ADMIN_TOKEN) as admin:
        kept = await admin.put(
            "/v1/admin/tenants/keeper/retention", json={"purge_after_days": 0}, headers=AUTH
        )
        brief = await admin.put(
            "/v1/admin/tenants/brief/retention", json={"purge_after_days": 5}, headers=AUTH
        )
        bad = await admin.put(
            "/v1/admin/tenants/keeper/retention", json={"purge_after_days": -1}, headers=AUTH
        )
        unknown = await admin.put(
            "/v1/admin/tenants/nobody/retention", json={"purge_after_days": 1}, headers=AUTH
        )
        shown = await admin.get("/v1/admin/retention", headers=AUTH)
    assert kept.status_code == 200 and kept.json()["tenant_id"] == keeper
    assert brief.status_code == 200
    assert bad.status_code == 422 and unknown.status_code == 404
    assert shown.json()["tenants"] == {keeper: 0.0, brief.json()["tenant_id"]: 5.0}
    engine = db.async_engine()
    try:  # the setting would keep 30 days: brief's 5 purge its message, keeper's 0 never
        purged = await maintenance.purge_by_retention(engine, now=now, default_days=30)
    finally:
        await engine.dispose()
    assert purged["messages"] == 1
    assert count(db, outbox_messages) == 1
    with db.engine.connect() as conn:
        left = conn.execute(select(outbox_messages.c.tenant_id)).scalar_one()
    assert left == keeper


@pytest.mark.parametrize(
    ("days", "code", "said"),
    [
        ("7", 0, "keeps finished messages 7 day(s)"),
        ("default", 0, "the PURGE_AFTER_DAYS setting's"),
        ("-1", 2, ""),
        ("nan", 2, "DAYS must be a number of days"),
        ("40000", 2, "DAYS must be a number of days"),
    ],
)
def test_tenants_retention_sets_a_tenants_days_or_refuses_writing_nothing(db, days, code, said):
    from mailbag.store.schema import tenant_retention

    new_tenant(db, "acme")
    env = {"MAILBAG_DATABASE_URL": db.url, "MAILBAG_SECRET_KEY": TEST_SECRET_KEY}
    result = runner.invoke(cli_app, ["tenants", "retention", "acme", "--", days], env=env)
    assert result.exit_code == code and said in result.output, result.output
    assert count(db, tenant_retention) == (1 if days == "7" else 0)
    unknown = runner.invoke(cli_app, ["tenants", "retention", "nobody", "3"], env=env)
    assert unknown.exit_code == 2 and "no tenant 'nobody'" in unknown.output


async def test_an_applications_own_connection_refuses_an_erased_address_too(db):
    import mailbag
    from api_helpers import settings_for

    async with api_client(db, admin_token=ADMIN_TOKEN) as admin:
        r = await admin.post("/v1/admin/erasures", json={"address": PERSON}, headers=AUTH)
        assert r.status_code == 201, r.text
    settings = settings_for(db)
    with db.engine.begin() as conn:  # an engine mailbag did not make: no options of its own
        refused = mailbag.enqueue(conn, to=PERSON.upper(), subject="s", text="t", settings=settings)
        welcome = mailbag.enqueue(conn, to=OTHER, subject="s", text="t", settings=settings)
    assert refused.message.status == "failed" and welcome.message.status == "pending"
