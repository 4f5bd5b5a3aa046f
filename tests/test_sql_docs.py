"""docs/sql is what the plans run: regenerated here (no database needed) and compared."""

from __future__ import annotations

from pathlib import Path

from mailbag.store import sqldocs


def test_docs_sql_holds_exactly_what_the_plans_run_today(tmp_path: Path) -> None:
    sqldocs.write(tmp_path)
    fresh = {path.name: path.read_text() for path in tmp_path.glob("*.sql")}
    committed = {path.name: path.read_text() for path in sqldocs.DOCS.glob("*.sql")}
    stale = sorted(
        name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name)
    )
    assert not stale, (
        f"docs/sql is out of date ({', '.join(stale[:5])}...): run `{sqldocs.COMMAND}`"
    )


def test_every_store_operation_is_in_the_sql_docs() -> None:
    registered = {operation.name for operation in sqldocs.OPERATIONS}
    missing = sqldocs.store_operations() - registered - set(sqldocs.PARTS)
    assert not missing, f"add these to sqldocs.OPERATIONS (or PARTS): {sorted(missing)}"
    assert len(registered) == len(sqldocs.OPERATIONS)  # one entry per operation


def test_the_recorder_takes_every_path_a_plan_branches_to() -> None:
    # MariaDB's claim reads a window of due ids, locks among them, updates, reads the rows
    # back and records their events; PostgreSQL does it all in one statement. Both then
    # read the claimed messages' attachments (references) in one more.
    claim = next(op for op in sqldocs.OPERATIONS if op.name == "dispatch.claim")
    mysql = sqldocs.record(claim, "mysql")
    assert len(mysql) == 6
    assert "FOR UPDATE SKIP LOCKED" in mysql[1] and mysql[2].startswith("UPDATE")
    assert "message_attachments" in mysql[5]
    assert len(sqldocs.record(claim, "postgresql")) == 2
    # Enqueue checks the sender, then suppressions, and writes the attachment's bytes.
    enqueue = next(op for op in sqldocs.OPERATIONS if op.name == "enqueue.enqueue")
    sqlite = sqldocs.record(enqueue, "sqlite")
    assert "tenant_senders" in sqlite[0] and "suppressions" in sqlite[1]
    assert any(sql.startswith("INSERT INTO attachments") for sql in sqlite)
