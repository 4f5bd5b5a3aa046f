"""Keys and addresses are compared byte for byte on every database.

MariaDB's utf8mb4 collations compare without case and without accents, so there
`Order-1` and `order-1` were one Idempotency-Key (the second request got the first's
answer, or a 409), and a suppression of `adá@example.com` blocked `ada@example.com`, a
different mailbox. PostgreSQL and SQLite compare exactly; now MariaDB does too.
"""

from __future__ import annotations

import pytest
from sqlalchemy import JSON, text

from api_helpers import api_client, new_tenant
from mailbag.store.schema import CASELESS, EXACT, metadata

from helpers import enqueue

ADMIN_TOKEN = "admin-token-for-exact-keys-0123456789"
BODY = {"template": "welcome", "data": {"name": "Ada"}}


async def test_idempotency_keys_that_differ_in_case_are_two_keys(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        answers = [
            await api.post(
                "/v1/messages",
                json={**BODY, "to": f"user{i}@example.com"},
                headers={"Idempotency-Key": idempotency_key},
            )
            for i, idempotency_key in enumerate(["Order-1", "order-1", "ORDER-1", "oRDER-1"])
        ]
        assert [a.status_code for a in answers] == [201] * 4, [a.text for a in answers]
        assert len({a.json()["id"] for a in answers}) == 4
        # Each key still replays its own answer.
        again = await api.post(
            "/v1/messages",
            json={**BODY, "to": "user1@example.com"},
            headers={"Idempotency-Key": "order-1"},
        )
        assert again.status_code == 201 and again.json()["id"] == answers[1].json()["id"]


async def test_a_suppressed_address_blocks_only_itself(db):
    tenant, key = new_tenant(db)
    async with api_client(db, key, admin_token=ADMIN_TOKEN) as api:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        for email in ("adá@example.com", "ada@example.com"):
            added = await api.post(
                "/v1/admin/suppressions", json={"tenant_id": tenant, "email": email}, headers=admin
            )
            assert added.status_code == 201 and added.json() == {"added": True}, added.text
        listed = await api.get(
            "/v1/admin/suppressions", params={"tenant_id": tenant}, headers=admin
        )
        assert sorted(s["email"] for s in listed.json()) == ["ada@example.com", "adá@example.com"]
        removed = await api.delete(
            f"/v1/admin/suppressions/{tenant}/adá@example.com", headers=admin
        )
        assert removed.status_code == 200, removed.text
        sent = await api.post("/v1/messages", json={**BODY, "to": "adá@example.com"})
        blocked = await api.post("/v1/messages", json={**BODY, "to": "ada@example.com"})
    assert sent.status_code == 201 and sent.json()["status"] == "pending", sent.text
    assert blocked.status_code == 201 and blocked.json()["status"] == "failed", blocked.text


@pytest.mark.parametrize("db", ["mysql"], indirect=True)
def test_every_text_column_on_mariadb_compares_exactly_but_the_recipient(db):
    with db.engine.connect() as conn:
        collations = conn.execute(
            text(
                "SELECT table_name, column_name, collation_name FROM information_schema.columns"
                " WHERE table_schema = DATABASE() AND collation_name IS NOT NULL"
                " AND table_name <> 'alembic_version'"
            )
        ).all()
    assert len(collations) > 40  # every table's text columns
    exact = EXACT["mariadb" if db.engine.dialect.is_mariadb else "mysql"]
    # MariaDB gives a JSON column of a table created after 0013 its own utf8mb4_bin: binary
    # too (only trailing spaces pad), and a document is never compared as a key.
    documents = {
        (table.name, column.name)
        for table in metadata.tables.values()
        for column in table.columns
        if isinstance(column.type, JSON)
    }
    loose = {
        (t, c): coll
        for t, c, coll in collations
        if coll != exact and not ((t, c) in documents and coll == "utf8mb4_bin")
    }
    assert loose == {("outbox_messages", "to_address"): CASELESS}


def test_a_trailing_space_makes_another_key(db):
    # HTTP strips it from a header; an application enqueueing in its own transaction may not.
    (first,) = enqueue(db, idempotency_key="k-1")
    (second,) = enqueue(db, idempotency_key="k-1 ")
    (again,) = enqueue(db, idempotency_key="k-1 ")
    assert first.id != second.id and again.id == second.id
