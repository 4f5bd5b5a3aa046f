"""A tenant's messages to one recipient (`GET /v1/messages?to=`, the console's filter, bulk
actions by filter): the same mailbox whatever the case, never another one, and found
through an index on every database (MariaDB included, which has no expression index)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select, text

from mailbag.domain.message import Filter
from mailbag.store import messages
from mailbag.store.plan import run
from mailbag.store.schema import outbox_messages

from conftest import TestDB
from helpers import message_row, query_plan

SAME = ["ada@example.com", "Ada@Example.COM", "ADA@EXAMPLE.COM", "adA@example.com"]
OTHERS = [
    "adá@example.com",  # another mailbox, which MariaDB's collation calls equal to ada
    "ada@example.co",
    "bada@example.com",
    "ada@example.com.evil",
]
INDEX = {
    "postgresql": "ix_outbox_messages_tenant_id_lower_to_address",
    "sqlite": "ix_outbox_messages_tenant_id_lower_to_address",
    "mysql": "ix_outbox_messages_to_address",
}


def _fill(db: TestDB) -> set[Any]:
    """Messages to the same mailbox in several spellings, to others, and to the same one
    in another tenant; returns the ids a filter for ada@example.com in t1 must find."""
    mine = [message_row(to_address=a) for a in SAME]
    rows = mine + [message_row(to_address=a) for a in OTHERS]
    rows += [message_row(tenant_id="t2", to_address=a) for a in SAME]
    # Enough of other recipients that reading them all would cost more than the index.
    rows += [
        message_row(tenant_id=f"t{i % 3}", to_address=f"user{i}@example.com") for i in range(300)
    ]
    with db.engine.begin() as conn:
        conn.execute(insert(outbox_messages), rows)
    return {row["id"] for row in mine}


def test_the_filter_finds_one_mailbox_in_any_case_and_no_other(db):
    wanted = _fill(db)
    for spelled in ("ada@example.com", "ADA@Example.Com"):
        with db.engine.connect() as conn:
            found, more = run(conn, messages.page(Filter(tenant_id="t1", to=spelled), limit=50))
        assert {m.id for m in found} == wanted, [m.to_address for m in found]
        assert not more
    with db.engine.connect() as conn:
        found, _ = run(conn, messages.page(Filter(tenant_id="t1", to="adá@example.com"), limit=50))
    assert [m.to_address for m in found] == ["adá@example.com"]


def test_the_filter_reads_an_index_not_the_table(db):
    _fill(db)
    query = select(outbox_messages.c.id).where(
        messages.matching(Filter(tenant_id="t1", to="Ada@Example.com"))
    )
    with db.engine.begin() as conn:
        if db.dialect == "postgresql":
            conn.execute(text("ANALYZE outbox_messages"))
            conn.execute(text("SET LOCAL enable_seqscan = off"))  # as at 10^7 rows
        elif db.dialect == "mysql":
            conn.execute(text("ANALYZE TABLE outbox_messages"))
        else:
            conn.execute(text("ANALYZE outbox_messages"))
        plan = query_plan(conn, query)
    assert INDEX[db.dialect] in plan, plan
    if db.dialect == "mysql":
        # Before: `lower(to_address) = ...` could use no index and read every row.
        assert "key=None" not in plan, plan
