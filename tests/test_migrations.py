"""The Alembic migration creates exactly the schema the code's table definitions describe."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from mailbag.store import migrate
from mailbag.store.schema import metadata_for


def test_the_migration_and_the_table_definitions_agree(db):
    with db.engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        diff = compare_metadata(context, metadata_for(conn.dialect.name))
    assert diff == []


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
