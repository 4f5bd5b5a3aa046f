"""The Alembic migration creates exactly the schema the code's table definitions describe,
once, even when several processes migrate at the same moment."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from mailbag.store import migrate
from mailbag.store.database import make_engine
from mailbag.store.schema import metadata_for

from conftest import _server_database


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
        assert claimable["column_names"] == ["next_attempt_at", "id"]
        where = claimable["dialect_options"][f"{db.dialect}_where"]
        assert "pending" in str(where) and "retrying" in str(where)


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
