"""store/bulk_insert.py: rows written as one statement on PostgreSQL (jsonb_to_recordset)
come back exactly as the executemany elsewhere writes them, every column type included."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import insert, select

from mailbag.domain.ids import uuid7
from mailbag.store.bulk_insert import insert_rows
from mailbag.store.message_transitions import om
from mailbag.store.plan import Plan, current_dialect
from mailbag.store.session import Session

from conftest import TestDB

NOW = datetime(2026, 12, 3, 9, 30, 15, 123456, tzinfo=UTC)


def _row(key: str, **changed: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": uuid7(),
        "tenant_id": "default",
        "idempotency_key": key,
        "to_address": "zoë@bücher.example",
        "to_name": 'A "quoted" name, with \\ and \u2028',
        "from_address": None,
        "subject": None,
        "template_name": "welcome",
        "template_data": {"name": "Zoë", "n": 1.5, "list": [1, None, "x"], "deep": {"a": {}}},
        "headers": {},
        "tags": ["a", "b"],
        "metadata": {},
        "status": "pending",
        "attempt_count": 0,
        "max_attempts": 5,
        # Another offset than UTC: stored as the same instant.
        "next_attempt_at": NOW.astimezone(timezone(timedelta(hours=-5))),
        "created_at": NOW,
        "updated_at": NOW.replace(microsecond=0),
        "claim_token": None,
        "claimed_by": None,
        "claimed_at": None,
        "lease_expires_at": None,
        "provider": None,
        "provider_message_id": None,
        "last_error": None,
        "sent_at": None,
        "ambiguous_since": None,
        "carried": None,
        "expires_at": None,
        "priority": 1,
        "claim_order_at": NOW,
        "attachment_count": 0,
        "bulk": True,
        "template_version_id": 2**62 + 1,
        "template_version": 3,
        "template_locale": "de-CH",
    }
    return {**row, **changed}


def _write(rows: list[dict[str, Any]]) -> Plan[None]:
    dialect = yield from current_dialect()
    yield insert_rows(dialect, om, rows, unless_taken=(om.c.tenant_id, om.c.idempotency_key))


def _stored(db: TestDB) -> dict[str, dict[str, Any]]:
    with db.engine.connect() as conn:
        return {row.idempotency_key: row._asdict() for row in conn.execute(select(om))}


def test_rows_come_back_as_given_and_a_taken_key_is_skipped(db: TestDB) -> None:
    rows = [
        _row("plain"),
        _row("carried", carried={"html": "<p>ü</p>", "suppressed": ["x@example.com"]}),
        _row("null-data", template_data=None, tags=[]),
    ]
    with db.engine.begin() as conn:
        Session(conn).run(_write(rows))
    again = _row("plain", to_address="other@example.com")
    with db.engine.begin() as conn:
        Session(conn).run(_write([again, _row("new")]))  # no error, the first row skipped
    stored = _stored(db)
    assert set(stored) == {"plain", "carried", "null-data", "new"}
    for given in rows:
        got = stored[given["idempotency_key"]]
        for name, value in given.items():
            if isinstance(value, datetime):
                assert got[name] == value.astimezone(UTC), name
            elif name == "template_data" and value is None:
                # A JSON column that keeps None as JSON null, as SQLAlchemy writes it.
                assert got[name] is None, name
            else:
                assert got[name] == value, name
    assert stored["plain"]["to_address"] == "zoë@bücher.example"  # not the skipped row's
    # None in a column that keeps it as JSON null is JSON null, not SQL NULL: as the
    # executemany writes it.
    with db.engine.begin() as conn:
        conn.execute(insert(om), [_row("null-plain", template_data=None)])
        sql_null = conn.execute(
            select(om.c.idempotency_key).where(om.c.template_data.is_(None))
        ).scalars()
        assert set(sql_null) == set()


def test_what_orjson_cannot_write_goes_by_the_executemany(db: TestDB) -> None:
    big = 2**70  # beyond orjson's 64 bits: the chunk is written SQLAlchemy's way
    with db.engine.begin() as conn:
        Session(conn).run(_write([_row("big", template_data={"n": big}), _row("small")]))
    stored = _stored(db)
    assert stored["big"]["template_data"] == {"n": big}
    assert stored["small"]["template_data"]["name"] == "Zoë"


def test_a_non_text_key_goes_by_the_executemany_as_json_writes_it(db: TestDB) -> None:
    # orjson refuses a key that is not text; the stdlib JSON the executemany uses makes it one.
    with db.engine.begin() as conn:
        Session(conn).run(_write([_row("int-key", metadata={1: "one"}), _row("other")]))
    assert _stored(db)["int-key"]["metadata"] == {"1": "one"}


def test_a_naive_time_is_refused_on_every_path(db: TestDB) -> None:
    with pytest.raises(Exception, match="aware datetimes only"), db.engine.begin() as conn:
        Session(conn).run(_write([_row("naive", created_at=NOW.replace(tzinfo=None))]))
    assert _stored(db) == {}
