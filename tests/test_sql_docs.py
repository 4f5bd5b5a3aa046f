"""docs/sql is what the plans run: regenerated here (no database needed) and compared."""

from __future__ import annotations

import re
from pathlib import Path

from mailbag import sqldocs, sqlrecorder


def test_docs_sql_holds_exactly_what_the_plans_run_today(tmp_path: Path) -> None:
    sqldocs.write(tmp_path)
    fresh = {path.name: path.read_text() for path in tmp_path.iterdir()}
    committed = {path.name: path.read_text() for path in sqldocs.DOCS.iterdir()}
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
    # MariaDB's claim reads the lanes with due mail and their shares, a window of each
    # lane's due ids, locks among them, updates, reads the rows back and records their
    # events; PostgreSQL does it all in one statement. Both then read the claimed messages'
    # attachments (references) in one more.
    claim = next(op for op in sqldocs.OPERATIONS if op.name == "dispatch.claim")
    mysql = [" ".join(sql.split()) for sql in sqldocs.record(claim, "mysql")]  # unwrapped
    assert len(mysql) == 7
    assert "lane_tenants" in mysql[0] and "claimable_tenant = " in mysql[1]
    assert "FOR UPDATE SKIP LOCKED" in mysql[2] and mysql[3].startswith("UPDATE")
    assert "message_attachments" in mysql[6]
    assert len(sqldocs.record(claim, "postgresql")) == 2
    # Enqueue checks the sender, then suppressions, and writes the attachment's bytes.
    enqueue = next(op for op in sqldocs.OPERATIONS if op.name == "enqueue.enqueue")
    sqlite = sqldocs.record(enqueue, "sqlite")
    assert "tenant_senders" in sqlite[0] and "suppressions" in sqlite[1]
    assert any(sql.startswith("INSERT INTO attachments") for sql in sqlite)


def test_each_database_has_one_file_with_every_operation_under_its_name() -> None:
    names = [entry.name for entry in sqldocs.OPERATIONS]
    for dialect in sqldocs.DATABASES:
        text = (sqldocs.DOCS / f"{dialect}.sql").read_text()
        assert re.findall(r"^-- name: (\S+) --$", text, re.MULTILINE) == [
            name for entries in sqldocs.groups().values() for name in (e.name for e in entries)
        ]
        assert sorted(re.findall(r"^-- name: (\S+) --$", text, re.MULTILINE)) == sorted(names)


def test_every_operation_says_in_one_sentence_what_it_does() -> None:
    vague = [entry.name for entry in sqldocs.OPERATIONS if len(entry.description) < 15]
    assert not vague


def test_the_sql_docs_read_as_sql_named_and_wrapped() -> None:
    for dialect in sqldocs.DATABASES:
        text = (sqldocs.DOCS / f"{dialect}.sql").read_text()
        long = [line for line in text.splitlines() if len(line) > sqlrecorder.WIDTH]
        assert long == []
        # Every parameter has a name: none is SQLAlchemy's anonymous param_N, and no
        # PostgreSQL cast hides among them.
        assert not re.search(r":param_\d", text)
        assert not re.search(r":\w+::", text)


def test_an_operation_that_runs_nothing_on_a_database_says_so() -> None:
    # SQLite's BEGIN IMMEDIATE already runs writers one at a time: the send lock takes none.
    lock = next(op for op in sqldocs.OPERATIONS if op.name == "verifications.lock_sends")
    assert sqldocs.record(lock, "sqlite") == []
    text = (sqldocs.DOCS / "sqlite.sql").read_text()
    entry = text.split("-- name: verifications.lock_sends --\n", 1)[1].split("\n\n", 1)[0]
    assert "-- No statement on SQLite" in entry


def test_the_index_links_each_operation_to_its_header_in_each_file() -> None:
    index = (sqldocs.DOCS / "README.md").read_text()
    for dialect in sqldocs.DATABASES:
        lines = (sqldocs.DOCS / f"{dialect}.sql").read_text().splitlines()
        for entry in sqldocs.OPERATIONS:
            link = re.search(rf"`{re.escape(entry.name)}` \|.*?\({dialect}\.sql#L(\d+)\)", index)
            assert link, (entry.name, dialect)
            assert lines[int(link.group(1)) - 1] == f"-- name: {entry.name} --"


def test_a_round_trip_is_shown_with_its_begin_and_commit() -> None:
    # The verification request's one round trip: BEGIN, the send lock, the one statement
    # and COMMIT go to PostgreSQL together (store.plan.together, AsyncDatabase.run_at_once).
    text = (sqldocs.DOCS / "postgresql.sql").read_text()
    entry = text.split("-- name: first_use.verification --\n", 1)[1]
    entry = entry.split("\n-- name: ", 1)[0]
    assert entry.count("-- step ") == 4 and "INSERT INTO email_verifications" in entry
    assert "BEGIN;" in entry and "COMMIT;" in entry


def test_wrapping_cuts_only_between_words_outside_quotes() -> None:
    line = "SELECT " + ", ".join(f"'a, b {n}' AS c{n}" for n in range(20)) + " FROM t"
    lines = sqlrecorder.wrap(line, 60)
    assert all(len(part) <= 60 for part in lines)
    assert " ".join(part.strip() for part in lines) == line
    assert all(part.count("'") % 2 == 0 for part in lines)
