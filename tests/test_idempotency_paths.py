"""The cases a keyed POST /v1/messages leaves to the general path. A key's first use is one
chain (store.first_use.message; on PostgreSQL one statement) that writes nothing unless it
is an ordinary first use; these cases run on every database so that both paths answer them
alike (tests/test_fast_paths.py compares the rows each way writes)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from api_helpers import api_client, new_tenant
from mailbag.clock import utcnow
from mailbag.services.intake import enqueue
from mailbag.store import suppressions
from mailbag.store.plan import run

from helpers import count_rows

BODY = {"to": "ada@example.com", "template": "welcome", "data": {"name": "Ada"}}


async def test_a_suppressed_recipient_is_born_failed_and_replays(db):
    tenant_id, key = new_tenant(db)
    with db.engine.begin() as conn:
        run(
            conn,
            suppressions.add(
                tenant_id=tenant_id, email="ADA@example.com", reason="bounce", now=utcnow()
            ),
        )
    async with api_client(db, key) as api:
        first = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "s"})
        again = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "s"})
    assert first.status_code == again.status_code == 201, first.text
    assert first.json()["status"] == "failed"
    assert first.json()["suppressed"] == ["ada@example.com"]
    assert again.content == first.content and again.headers["Idempotent-Replayed"] == "true"
    assert count_rows(db) == (1, 1)


async def test_a_key_an_application_enqueued_with_answers_with_its_message(db):
    tenant_id, key = new_tenant(db)
    with db.engine.begin() as conn:
        mine = enqueue(
            conn,
            to="ada@example.com",
            template="welcome",
            data={"name": "Ada"},
            tenant_id=tenant_id,
            idempotency_key="shared",
        ).message
    async with api_client(db, key) as api:
        first = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "shared"})
        again = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "shared"})
    assert first.status_code == 201 and first.json()["id"] == str(mine.id)
    assert again.content == first.content and again.headers["Idempotent-Replayed"] == "true"
    assert count_rows(db) == (1, 1)


async def test_a_key_used_again_after_its_record_expired_keeps_its_message(db):
    _, key = new_tenant(db)
    now = utcnow()
    later = now + timedelta(hours=25)  # past the default 24 hours
    async with api_client(db, key, clock=lambda: now) as api:
        first = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "old"})
    async with api_client(db, key, clock=lambda: later) as api:
        other = {**BODY, "data": {"name": "Eve"}}
        again = await api.post("/v1/messages", json=other, headers={"Idempotency-Key": "old"})
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert count_rows(db) == (1, 1)


async def test_a_key_taken_by_another_operation_is_a_conflict(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        verification = await api.post(
            "/v1/email-verifications",
            json={"email": "eve@example.com"},
            headers={"Idempotency-Key": "both"},
        )
        message = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "both"})
    assert verification.status_code == 201, verification.text
    assert message.status_code == 409
    assert message.json()["first_operation"] == "POST /v1/email-verifications"
    assert count_rows(db)[0] == 1  # the verification's email only


async def test_racing_first_uses_of_different_keys_and_one_key(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        replies = await asyncio.gather(
            *(
                api.post(
                    "/v1/messages",
                    json={**BODY, "to": f"u{i % 5}@example.com"},
                    headers={"Idempotency-Key": f"k{i % 5}"},
                )
                for i in range(25)
            )
        )
    assert {r.status_code for r in replies} == {201}
    assert len({r.json()["id"] for r in replies}) == 5
    assert count_rows(db) == (5, 5)
