"""The Alembic migration creates exactly the schema the code's table definitions describe,
once, even when several processes migrate at the same moment."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, insert, inspect, select, text, update

from mailbag.domain.ids import uuid7
from mailbag.domain.states import Status
from mailbag.store import dispatch, migrate
from mailbag.store import enqueue as enqueue_store
from mailbag.store import messages as message_store
from mailbag.store.database import make_engine
from mailbag.store.plan import run
from mailbag.store.schema import (
    email_verifications,
    message_events,
    metadata_for,
    outbox_messages,
    verification_events,
)

from conftest import _server_database
from helpers import T0, message


def test_the_migration_and_the_table_definitions_agree(db):
    with db.engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        diff = compare_metadata(context, metadata_for(conn.dialect.name))
    assert diff == []


def test_head_is_alembics_only_head():
    # Commands check the schema against migrate.HEAD without importing Alembic: a new
    # migration that does not bump HEAD fails here, not in production.
    from alembic.script import ScriptDirectory

    assert ScriptDirectory.from_config(migrate.alembic_config()).get_heads() == [migrate.HEAD]


def test_the_database_is_at_the_head_revision(db):
    with db.engine.connect() as conn:
        assert migrate.is_current(conn)


def test_claim_index_reads_only_claimable_rows(db):
    indexes = {ix["name"]: ix for ix in inspect(db.engine).get_indexes("outbox_messages")}
    if db.dialect == "mysql":
        # No partial indexes on MariaDB: the index is over a column that is NULL unless the
        # row is claimable.
        assert indexes["ix_outbox_messages_claimable_at_id"]["column_names"] == [
            "claimable_at",
            "id",
        ]
    else:
        claimable = indexes["ix_outbox_messages_claimable"]
        assert claimable["column_names"] == ["claim_order_at", "id"]
        where = claimable["dialect_options"][f"{db.dialect}_where"]
        assert "pending" in str(where) and "retrying" in str(where)
        leased = indexes["ix_outbox_messages_leased"]
        assert "processing" in str(leased["dialect_options"][f"{db.dialect}_where"])


def test_migrating_twice_changes_nothing(db):
    migrate.upgrade(db.engine)
    with db.engine.connect() as conn:
        assert migrate.is_current(conn)


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def fresh_url(request, tmp_path) -> Iterator[str]:
    """An empty database (no schema at all) of each kind, dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    with contextlib.contextmanager(_server_database)(request.param) as url:
        yield url


def migrate_once(url: str, start: Any) -> str | None:
    """In a child process: migrate, and say what went wrong (None when nothing did)."""
    engine = make_engine(url, null_pool=True)
    try:
        start.wait()
        migrate.upgrade(engine)
        return None
    except Exception as exc:
        return repr(exc)
    finally:
        engine.dispose()


def test_parallel_migrations_on_an_empty_database_all_succeed(fresh_url):
    # Replicas or scripts starting together once raced to create alembic_version
    # (UniqueViolation in 4 of 20 runs); the migration lock makes them take turns. Processes,
    # not threads: Alembic's context is per process. Forked, so they start in milliseconds.
    processes = 10
    context = multiprocessing.get_context("fork")
    with context.Manager() as manager, context.Pool(processes) as pool:
        start = manager.Barrier(processes)
        outcomes = pool.starmap(migrate_once, [(fresh_url, start)] * processes)
    assert [o for o in outcomes if o is not None] == []
    engine = make_engine(fresh_url, null_pool=True)
    with engine.connect() as conn:
        assert migrate.is_current(conn)
        assert conn.execute(text("SELECT COUNT(*) FROM alembic_version")).scalar() == 1
    engine.dispose()


def test_upgrading_a_database_with_data_keeps_every_row(fresh_url):
    # A database at 0005 with a message, its events and a verification (and its event)
    # goes to HEAD: SQLite rebuilds outbox_messages and email_verifications, and with
    # foreign keys on the rebuild's DROP would cascade to every event.
    engine = make_engine(fresh_url, null_pool=True)
    migrate.upgrade(engine, "0005_key_check")
    message_id, verification_id = uuid7(), uuid7()
    old = {
        "id": message_id,
        "tenant_id": "default",
        "idempotency_key": "k-1",
        "to_address": "ada@example.com",
        "to_name": "Ada",
        "from_address": None,
        "subject": None,
        "template_name": "welcome",
        "template_data": {"name": "Ada"},
        "headers": {"X-Campaign": "spring"},
        "tags": ["signup"],
        "metadata": {"verification_id": str(verification_id)},
        "status": Status.RETRYING.value,
        "attempt_count": 1,
        "max_attempts": 5,
        "next_attempt_at": T0,
        "created_at": T0 - timedelta(minutes=5),
        "updated_at": T0 - timedelta(minutes=4),
        "claim_token": None,
        "claimed_by": None,
        "claimed_at": None,
        "lease_expires_at": None,
        "provider": "smtp",
        "provider_message_id": None,
        "last_error": "421 try later",
        "sent_at": None,
        "ambiguous_since": None,
    }
    event = {"message_id": message_id, "at": T0, "actor": "api", "attempt": 0}
    verification = {
        "id": verification_id,
        "tenant_id": "default",
        "email": "ada@example.com",
        "state": "send_pending",
        "token_digest": "0" * 64,
        "expires_at": T0 + timedelta(hours=1),
        "confirm_attempts": 0,
        "send_count": 1,
        "message_id": message_id,
        "template_name": "verify",
        "redirect_url": None,
        "created_at": T0,
        "updated_at": T0,
    }
    with engine.begin() as conn:
        # Only the columns 0005 has: the INSERT names exactly these.
        conn.execute(insert(outbox_messages).values(old))
        conn.execute(
            insert(message_events),
            [
                {**event, "from_status": None, "to_status": "pending"},
                {**event, "from_status": "pending", "to_status": "processing", "attempt": 1},
                {**event, "from_status": "processing", "to_status": "retrying", "attempt": 1},
            ],
        )
        conn.execute(insert(email_verifications).values(verification))
        conn.execute(
            insert(verification_events).values(
                verification_id=verification_id, to_state="created", at=T0, actor="api"
            )
        )

    migrate.upgrade(engine)

    try:
        with engine.connect() as conn:
            assert migrate.is_current(conn)
            stored = run(conn, message_store.get(message_id))
            assert stored is not None
            assert {name: getattr(stored, name) for name in old} == old
            assert stored.claim_order_at == T0 and stored.priority == 0
            assert stored.recipients is None and stored.reply_to == () and stored.attachments == ()
            assert len(run(conn, message_store.events(message_id))) == 3
            assert conn.execute(select(func.count()).select_from(verification_events)).scalar() == 1
            assert conn.execute(select(email_verifications.c.state)).scalar() == "send_pending"
            if conn.dialect.name == "sqlite":
                assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        with engine.begin() as conn:
            claimed = run(
                conn,
                dispatch.claim(worker_id="w1", now=T0, lease=timedelta(minutes=1), limit=10),
            )
            assert [m.id for m in claimed.messages] == [message_id]
            # The new terminal state passes the rebuilt CHECK constraint.
            conn.execute(
                update(outbox_messages)
                .where(outbox_messages.c.id == message_id)
                .values(status=Status.EXPIRED.value)
            )
    finally:
        engine.dispose()


def test_0006_goes_back_to_0005_and_forward_again_keeping_the_messages(fresh_url):
    engine = make_engine(fresh_url, null_pool=True)
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            (created,) = run(
                conn,
                enqueue_store.enqueue(
                    [message(0, priority="high")], now=T0, default_max_attempts=5
                ),
            )
        message_id = created.message.id
        migrate.downgrade(engine, "0005_key_check")
        with engine.connect() as conn:
            assert migrate.current_revision(conn) == "0005_key_check"
            assert not inspect(conn).has_table("attachments")
            columns = {c["name"] for c in inspect(conn).get_columns("outbox_messages")}
            assert "claim_order_at" not in columns and "to_address" in columns
            assert conn.execute(select(func.count()).select_from(message_events)).scalar() == 1
        migrate.upgrade(engine)
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            assert compare_metadata(context, metadata_for(conn.dialect.name)) == []
            back = run(conn, message_store.get(message_id))
            # Priority did not survive 0005; the message did, due as before.
            assert back is not None and back.to_address == "user0@example.com"
            assert (back.priority, back.claim_order_at) == (0, T0)
            assert len(run(conn, message_store.events(message_id))) == 1
    finally:
        engine.dispose()
