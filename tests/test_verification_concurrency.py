"""Verification sends under concurrency: each resend rotates once, the limits hold.

Ten resends of one verification at once, each under its own Idempotency-Key, while the
per-address limit leaves four: exactly four are accepted, the rest are 429, the stored
digest is the newest email's, and the newest emailed code confirms. In process on each
database, and across two API processes on the database servers.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from api_helpers import api_client, new_tenant, settings_for
from mailbag.domain.verification import VAction, digest
from mailbag.services.verification import RotatedMeanwhile, Verifications
from mailbag.store import verifications as store
from mailbag.store.plan import run_async
from mailbag.store.schema import email_verifications, outbox_messages, verification_sends
from mailbag.store.session import AsyncSession
from servers import free_port, mailbag_env, start_mailbag, stop, wait_until_up
from verification_helpers import deliver, request, resend, token_in, tokens

from conftest import TestDB

RESENDS = 10
PER_ADDRESS = 5  # the default limit: the request spends one, four are left


def stored(db: TestDB, verification_id: str) -> tuple[int, str, list[str]]:
    """(send count, stored digest, the statuses of its emails in send order)."""
    with db.engine.connect() as conn:
        row = conn.execute(
            select(email_verifications).where(
                email_verifications.c.id == uuid.UUID(verification_id)
            )
        ).one()
        statuses = conn.execute(
            select(outbox_messages.c.status)
            .where(outbox_messages.c.idempotency_key.like(f"verification:{verification_id}:%"))
            .order_by(outbox_messages.c.id)
        ).scalars()
        return row.send_count, row.token_digest, list(statuses)


async def check_newest_confirms(
    db: TestDB, async_engine: Any, api: Any, verification_id: str, sends: int
) -> None:
    """The worker sends only the newest email; its code confirms, no older code does."""
    provider = await deliver(db, async_engine)
    (sent,) = provider.sent  # the older emails were withdrawn before they went out
    derive = tokens(db)
    vid = uuid.UUID(verification_id)
    assert token_in(sent) == derive.token(vid, sends)
    url = f"/v1/email-verifications/{verification_id}/confirm"
    for older in range(1, sends):
        wrong = await api.post(url, json={"token": derive.token(vid, older)})
        assert wrong.status_code == 400, wrong.text
    confirmed = await api.post(url, json={"token": token_in(sent)})
    assert confirmed.status_code == 200 and confirmed.json()["state"] == "verified"


def check_one_rotation_per_accepted_resend(
    db: TestDB, verification_id: str, statuses: list[int]
) -> int:
    accepted = statuses.count(200)
    assert accepted == PER_ADDRESS - 1, statuses
    assert statuses.count(429) == RESENDS - accepted, statuses
    send_count, stored_digest, emails = stored(db, verification_id)
    assert send_count == PER_ADDRESS
    # Exactly one digest stored, and it is the newest email's.
    assert stored_digest == digest(tokens(db).token(uuid.UUID(verification_id), send_count))
    assert emails == ["cancelled"] * (PER_ADDRESS - 1) + ["pending"]
    return send_count


async def test_concurrent_resends_rotate_once_each_and_keep_the_address_limit(db, async_engine):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        v = (await request(api)).json()
        replies = await asyncio.gather(
            *(resend(api, v["id"], f"resend-{i}") for i in range(RESENDS))
        )
        statuses = [r.status_code for r in replies]
        sends = check_one_rotation_per_accepted_resend(db, v["id"], statuses)
        limited = next(r for r in replies if r.status_code == 429)
        assert limited.json()["scope"] == "email" and int(limited.headers["Retry-After"]) > 1
        await check_newest_confirms(db, async_engine, api, v["id"], sends)


async def test_concurrent_requests_keep_the_tenant_limit(db):
    _, key = new_tenant(db)
    async with api_client(db, key, verification_sends_per_tenant_per_hour=3) as api:
        replies = await asyncio.gather(
            *(request(api, f"user{i}@example.com", key=f"signup-{i}") for i in range(RESENDS))
        )
    statuses = sorted(r.status_code for r in replies)
    assert statuses == [201] * 3 + [429] * (RESENDS - 3), [r.text for r in replies]
    assert all(r.json()["scope"] == "tenant" for r in replies if r.status_code == 429)
    with db.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(verification_sends)).scalar() == 3


def fail_verification(db: TestDB, verification_id: str) -> None:
    """As if its email had failed: the verification no longer holds its address."""
    with db.engine.begin() as conn:
        conn.execute(
            email_verifications.update()
            .where(email_verifications.c.id == uuid.UUID(verification_id))
            .values(state="send_failed")
        )


async def test_resending_a_failed_verification_whose_address_was_taken_again_is_409(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        old = (await request(api, key="first")).json()
        fail_verification(db, old["id"])
        new = (await request(api, key="second")).json()
        r = await resend(api, old["id"], "resend-old")
    assert r.status_code == 409 and r.json()["active_verification_id"] == new["id"]


async def test_a_request_and_resends_for_one_address_at_once_share_its_limit(db):
    _, key = new_tenant(db)
    async with api_client(db, key, verification_sends_per_email_per_hour=3) as api:
        old = (await request(api, key="first")).json()
        fail_verification(db, old["id"])
        replies = await asyncio.gather(
            request(api, key="second"),
            *(resend(api, old["id"], f"resend-{i}") for i in range(RESENDS)),
        )
    statuses = [r.status_code for r in replies]
    assert set(statuses) <= {200, 201, 409, 429}, statuses
    with db.engine.connect() as conn:
        sends = conn.execute(select(func.count()).select_from(verification_sends)).scalar()
        active = conn.execute(
            select(func.count())
            .select_from(email_verifications)
            .where(email_verifications.c.state.in_(["created", "send_pending", "sent"]))
        ).scalar()
    assert sends == 1 + statuses.count(200) + statuses.count(201) <= 3
    assert active == 1  # whichever won holds the address; the other side got 409s


@pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)
async def test_concurrent_resends_across_two_api_processes(db, async_engine):
    _, key = new_tenant(db)
    ports = [free_port(), free_port()]
    servers = [start_mailbag("api", "--port", str(port), env=mailbag_env(db.url)) for port in ports]
    bases = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        await asyncio.gather(
            *(
                asyncio.to_thread(wait_until_up, f"{base}/healthz", 60, server)
                for base, server in zip(bases, servers, strict=True)
            )
        )
        headers = {"Authorization": f"Bearer {key}"}
        clients = [httpx.AsyncClient(base_url=base, headers=headers, timeout=30) for base in bases]
        try:
            v = (await request(clients[0])).json()
            replies = await asyncio.gather(
                *(resend(clients[i % 2], v["id"], f"resend-{i}") for i in range(RESENDS))
            )
        finally:
            for client in clients:
                await client.aclose()
    finally:
        for server in servers:
            stop(server)
    statuses = [r.status_code for r in replies]
    sends = check_one_rotation_per_accepted_resend(db, v["id"], statuses)
    async with api_client(db, key) as api:
        await check_newest_confirms(db, async_engine, api, v["id"], sends)


async def test_a_rotation_from_a_stale_read_changes_nothing_and_is_retried(db, async_engine):
    """The guard under the lock: a send that read an older send number moves nothing (so it
    can never store a digest no email carries); the resend reads again and rotates once."""
    tenant_id, key = new_tenant(db)
    service = Verifications(async_engine, settings_for(db))
    async with api_client(db, key) as api:
        v = (await request(api)).json()
    vid = uuid.UUID(v["id"])
    async with async_engine.connect() as conn:
        stale = await run_async(conn, store.get(vid, tenant_id))
    now = datetime.now(UTC)
    await service.resend(tenant_id=tenant_id, key="first", verification_id=vid, now=now)
    with pytest.raises(RotatedMeanwhile):
        async with async_engine.begin() as conn:
            await service._send(AsyncSession(conn), stale, {}, now, VAction.RESEND)
    assert stored(db, v["id"])[:2] == (2, digest(tokens(db).token(vid, 2)))

    # A resend that loses the race once reads again and rotates exactly once.
    real_send, lost = service._send, []

    async def lose_once(conn: Any, fresh: Any, *args: Any) -> Any:
        if not lost:
            lost.append(fresh.send_count)
            raise RotatedMeanwhile()
        return await real_send(conn, fresh, *args)

    service._send = lose_once  # type: ignore[method-assign]
    r = await service.resend(tenant_id=tenant_id, key="second", verification_id=vid, now=now)
    assert r.status == 200 and r.body["send_count"] == 3 and lost == [2]
    assert stored(db, v["id"])[0] == 3
