"""The purge's chunks read the oldest finished messages from an index already in updated_at
order (migration 0012), and purge deletes exactly the finished messages older than the cutoff:
never an `unknown` one, never an unfinished one, never one changed at or after the cutoff."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, insert, inspect, select, text

from mailbag.domain.states import TERMINAL, Status
from mailbag.store import migrate, operator
from mailbag.store.database import make_engine
from mailbag.store.plan import answering, dialect_of_connection, run
from mailbag.store.schema import message_events, outbox_messages

from conftest import TestDB, _server_database
from helpers import T0, message_row, query_plan

CUTOFF = T0
INDEX = {
    "postgresql": "ix_outbox_messages_finished_updated_at",
    "sqlite": "ix_outbox_messages_finished_updated_at",
    "mysql": "ix_outbox_messages_updated_at_status",
}


def _fill(db: TestDB) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every state, each older than, at and newer than the cutoff; one event per message.
    Returns (the rows purge must delete, oldest first; the rows it must keep)."""
    rows = []
    for i, status in enumerate(sorted(Status)):
        rows.append(message_row(status=status, at=CUTOFF))  # not older than the cutoff: kept
        for minutes in (-3000, -2000, -1000, 1000):
            # Distinct times, interleaved across states, so the order is checkable.
            rows.append(
                message_row(status=status, at=CUTOFF + timedelta(minutes=minutes, seconds=i))
            )
    with db.engine.begin() as conn:
        conn.execute(insert(outbox_messages), rows)
        conn.execute(
            insert(message_events),
            [
                {
                    "message_id": r["id"],
                    "to_status": r["status"],
                    "at": r["updated_at"],
                    "actor": "t",
                    "attempt": 1,
                }
                for r in rows
            ],
        )
    gone = sorted(
        (r for r in rows if r["status"] in TERMINAL and r["updated_at"] < CUTOFF),
        key=lambda r: r["updated_at"],
    )
    kept = [r for r in rows if r not in gone]
    return gone, kept


def _purge(db: TestDB, limit: int) -> int:
    with db.engine.begin() as conn:
        return run(conn, operator.purge(older_than=CUTOFF, limit=limit))


def _ids(conn: Connection, column: Any) -> set[Any]:
    return set(conn.execute(select(column)).scalars())


def test_purge_deletes_exactly_the_finished_rows_older_than_the_cutoff_oldest_first(db):
    gone, kept = _fill(db)
    assert len(gone) == 3 * len(TERMINAL) and Status.UNKNOWN not in {r["status"] for r in gone}

    # One chunk: the oldest eligible rows, whatever their state.
    assert _purge(db, limit=4) == 4
    with db.engine.connect() as conn:
        left = _ids(conn, outbox_messages.c.id)
    assert {r["id"] for r in gone[:4]}.isdisjoint(left)
    assert {r["id"] for r in gone[4:] + kept} == left

    # The rest in chunks, until a short one says it is done.
    counts = [_purge(db, limit=4) for _ in range(4)]
    assert counts == [4, 4, 3, 0]
    with db.engine.connect() as conn:
        assert _ids(conn, outbox_messages.c.id) == {r["id"] for r in kept}
        assert _ids(conn, message_events.c.message_id) == {r["id"] for r in kept}


def _chunk_plan(conn: Connection) -> str:
    """The query plan of purge's first step (the chunk's selection). A chunk smaller than
    the eligible rows, as at scale (1000 of millions)."""
    dialect = dialect_of_connection(conn)
    select_step = next(answering(operator.purge(older_than=CUTOFF, limit=3), dialect))
    return query_plan(conn, select_step.statement)


def test_a_purge_chunk_reads_the_index_in_order_without_sorting(db):
    _fill(db)
    with db.engine.begin() as conn:
        if db.dialect == "postgresql":
            conn.execute(text("ANALYZE outbox_messages"))
            # A table this small would be read whole whatever its indexes: ask what the
            # planner does once reading it whole is not an option, as at 10^7 rows.
            conn.execute(text("SET LOCAL enable_seqscan = off"))
        elif db.dialect == "mysql":
            conn.execute(text("ANALYZE TABLE outbox_messages"))
        else:
            # Without statistics SQLite guesses that `status IN (...)` on (status, updated_at)
            # finds few rows and sorts them; with them (ANALYZE, PRAGMA optimize) it takes
            # the partial index.
            conn.execute(text("ANALYZE outbox_messages"))
        plan = _chunk_plan(conn)
    assert INDEX[db.dialect] in plan, plan
    # Before 0012 every chunk sorted all eligible rows: a Sort node (PostgreSQL), a temporary
    # b-tree for the ORDER BY (SQLite), a filesort (MariaDB).
    assert "Sort" not in plan and "TEMP B-TREE" not in plan and "filesort" not in plan, plan


def test_an_index_built_concurrently_beforehand_is_kept_by_the_migration(postgresql_url):
    # Building it inside the upgrade holds writes for the build (seconds at 10^7 rows): an
    # operator may build it first with CONCURRENTLY, and the upgrade must then go through.
    with contextlib.contextmanager(_server_database)("postgresql") as url:
        engine = make_engine(url, null_pool=True)
        try:
            migrate.upgrade(engine, "0011_verification_expiry_index")
            with engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").execute(
                    text(
                        f"CREATE INDEX CONCURRENTLY {INDEX['postgresql']} ON outbox_messages "
                        "(updated_at) WHERE status IN "
                        "('cancelled', 'dead', 'expired', 'failed', 'sent')"
                    )
                )
            migrate.upgrade(engine)
            with engine.connect() as conn:
                assert migrate.is_current(conn)
            names = {ix["name"] for ix in inspect(engine).get_indexes("outbox_messages")}
            assert INDEX["postgresql"] in names
        finally:
            engine.dispose()
