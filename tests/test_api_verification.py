"""The email-verification workflow through the real app and a real worker, on each database."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from api_helpers import api_client, new_tenant
from mailbag.domain.delivery import Ambiguous, Decision, Rejected
from mailbag.domain.states import Action
from mailbag.domain.verification import VERIFICATIONS, VState, digest
from mailbag.store import dispatch
from mailbag.store.plan import run_async
from mailbag.store.schema import email_verifications, idempotency_records, verification_events
from mailbag.store.verifications import follow_messages
from verification_helpers import deliver, request, token_in, tokens

from helpers import get
from memory_provider import MemoryProvider


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


async def test_request_send_confirm_and_replay(db, async_engine):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        created = await request(
            api, "New.User@Example.COM", redirect_url="https://app.example.com/verify?x=1"
        )
        assert created.status_code == 201, created.text
        v = created.json()
        assert (v["email"], v["state"]) == ("New.User@example.com", "send_pending")

        provider = await deliver(db, async_engine)
        (email,) = provider.sent
        token = token_in(email)
        assert f"verification_id={v['id']}&token={token}" in email.text
        state = (await api.get(f"/v1/email-verifications/{v['id']}")).json()
        assert state["state"] == "sent" and state["sent_at"]

        confirmed = await api.post(
            f"/v1/email-verifications/{v['id']}/confirm", json={"token": token}
        )
        assert confirmed.status_code == 200 and confirmed.json()["state"] == "verified"
        again = await api.post(f"/v1/email-verifications/{v['id']}/confirm", json={"token": token})
        assert again.status_code == 200  # confirming twice is fine

        replay = await request(
            api, "New.User@Example.COM", redirect_url="https://app.example.com/verify?x=1"
        )
        assert replay.status_code == 201 and replay.json() == created.json()
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert len(provider.sent) == 1  # the replay sent nothing

    # The token lives only in the email: never in the response, the record or the row.
    with db.engine.connect() as conn:
        record = conn.execute(select(idempotency_records)).one()
        row = conn.execute(select(email_verifications)).one()
        history = [
            e.to_state
            for e in conn.execute(select(verification_events).order_by(verification_events.c.id))
        ]
    assert token not in str(record.response_body) and token not in created.text
    assert row.token_digest == digest(token) and token not in str(row._mapping.values())
    assert history == ["created", "send_pending", "sent", "verified"]
    sources = [None, *history[:-1]]
    assert all(
        VERIFICATIONS.can_move(VState(a) if a else None, VState(b))
        for a, b in zip(sources, history, strict=True)
    )


async def test_the_message_api_never_shows_the_token(db, async_engine):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        v = (await request(api)).json()
        message = (await api.get(f"/v1/messages/{v['message_id']}")).json()
    token = tokens(db).token(uuid.UUID(v["id"]), 1)
    assert token not in str(message) and "token" not in message["data"]
    assert message["metadata"]["verification_send"] == 1


async def test_a_second_request_for_an_active_address_names_the_first(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        first = (await request(api, key="a")).json()
        second = await request(api, "NEW.user@example.com".replace("NEW", "new"), key="b")
        assert second.status_code == 409
        assert second.json()["active_verification_id"] == first["id"]
        different_body = await request(api, "other@example.com", key="a")
        assert different_body.status_code == 409
        assert different_body.json()["type"].endswith("/idempotency-key-reused")


async def test_an_idempotency_key_is_required(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        r = await api.post("/v1/email-verifications", json={"email": "a@example.com"})
    assert r.status_code == 400 and r.json()["type"].endswith("/idempotency-key-required")


async def test_wrong_tokens_count_and_lock(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        v = (await request(api)).json()
        url = f"/v1/email-verifications/{v['id']}/confirm"
        for left in (4, 3, 2, 1, 0):
            r = await api.post(url, json={"token": "wrong"})
            assert r.status_code == 400 and r.json()["attempts_left"] == left
        assert (await api.post(url, json={"token": "wrong"})).status_code == 423


async def test_expiry_is_410_and_a_new_request_makes_a_new_row(db, async_engine):
    _, key = new_tenant(db)
    clock = Clock()
    async with api_client(db, key, clock=clock) as api:
        v = (await request(api)).json()
        provider = await deliver(db, async_engine)
        clock.now += timedelta(days=2)
        r = await api.post(
            f"/v1/email-verifications/{v['id']}/confirm", json={"token": token_in(provider.sent[0])}
        )
        assert r.status_code == 410
        assert (await api.get(f"/v1/email-verifications/{v['id']}")).json()["state"] == "expired"
        fresh = await request(api, key="signup-2")
        assert fresh.status_code == 201 and fresh.json()["id"] != v["id"]


async def test_resend_rotates_the_token(db, async_engine):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        v = (await request(api)).json()
        first = token_in((await deliver(db, async_engine)).sent[0])
        resent = await api.post(
            f"/v1/email-verifications/{v['id']}/resend", headers={"Idempotency-Key": "resend-1"}
        )
        assert resent.status_code == 200 and resent.json()["send_count"] == 2
        replay = await api.post(
            f"/v1/email-verifications/{v['id']}/resend", headers={"Idempotency-Key": "resend-1"}
        )
        assert replay.json()["send_count"] == 2  # the replay sent nothing more
        second = token_in((await deliver(db, async_engine)).sent[0])
        assert second != first
        url = f"/v1/email-verifications/{v['id']}/confirm"
        assert (await api.post(url, json={"token": first})).status_code == 400
        assert (await api.post(url, json={"token": second})).json()["state"] == "verified"
        finished = await api.post(
            f"/v1/email-verifications/{v['id']}/resend", headers={"Idempotency-Key": "resend-2"}
        )
        assert finished.status_code == 409


async def test_resend_withdraws_an_unsent_email(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        v = (await request(api)).json()
        await api.post(
            f"/v1/email-verifications/{v['id']}/resend", headers={"Idempotency-Key": "r"}
        )
    assert get(db, uuid.UUID(v["message_id"])).status == "cancelled"


async def test_sends_per_address_are_limited(db):
    _, key = new_tenant(db)
    async with api_client(db, key, verification_sends_per_email_per_hour=3) as api:
        v = (await request(api)).json()
        for i in range(2):
            r = await api.post(
                f"/v1/email-verifications/{v['id']}/resend", headers={"Idempotency-Key": f"r{i}"}
            )
            assert r.status_code == 200
        limited = await api.post(
            f"/v1/email-verifications/{v['id']}/resend", headers={"Idempotency-Key": "r-last"}
        )
        assert limited.status_code == 429
        assert 3500 <= int(limited.headers["Retry-After"]) <= 3601
        assert limited.json()["scope"] == "email"


async def test_sends_per_tenant_are_limited(db):
    _, key = new_tenant(db)
    async with api_client(db, key, verification_sends_per_tenant_per_hour=2) as api:
        assert (await request(api, "a@example.com", key="1")).status_code == 201
        assert (await request(api, "b@example.com", key="2")).status_code == 201
        limited = await request(api, "c@example.com", key="3")
        assert limited.status_code == 429 and limited.json()["scope"] == "tenant"


async def test_a_failed_email_fails_the_verification_and_frees_the_address(db, async_engine):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        v = (await request(api)).json()
        await deliver(db, async_engine, MemoryProvider(lambda e, n: Rejected("550 no user")))
        state = (await api.get(f"/v1/email-verifications/{v['id']}")).json()["state"]
        assert state == "send_failed"
        assert (await request(api, key="again")).status_code == 201


async def test_an_unknown_send_stays_send_pending(db, async_engine):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        v = (await request(api)).json()
        await deliver(db, async_engine, MemoryProvider(lambda e, n: Ambiguous("timeout")))
        state = (await api.get(f"/v1/email-verifications/{v['id']}")).json()["state"]
    assert state == "send_pending"


async def test_a_late_failure_never_moves_a_verified_address_back(db, async_engine):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        v = (await request(api)).json()
        # The user got the email (we derive its token as the worker would) before the
        # worker concluded anything, and confirmed.
        message = get(db, uuid.UUID(v["message_id"]))
        token = tokens(db).token(uuid.UUID(v["id"]), 1)
        url = f"/v1/email-verifications/{v['id']}/confirm"
        assert (await api.post(url, json={"token": token})).json()["state"] == "verified"
        # Now the send is finalized as failed, late.
        async with async_engine.begin() as conn:
            claim = await run_async(
                conn,
                dispatch.claim(
                    worker_id="late",
                    now=datetime.now(UTC) + timedelta(seconds=1),
                    lease=timedelta(seconds=30),
                    limit=1,
                ),
            )
            done = await run_async(
                conn,
                dispatch.finalize(
                    token=claim.token,
                    now=datetime.now(UTC),
                    actor="late",
                    decisions={message.id: Decision(Action.FAIL, error="550")},
                ),
            )
            moved = await run_async(
                conn, follow_messages(done.changed, now=datetime.now(UTC), actor="late")
            )
        assert moved == []
        assert (await api.get(f"/v1/email-verifications/{v['id']}")).json()["state"] == "verified"


async def test_concurrent_identical_requests_make_one_verification(db, async_engine):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        replies = await asyncio.gather(*(request(api, key="burst") for _ in range(20)))
        assert {r.status_code for r in replies} == {201}
        assert len({r.json()["id"] for r in replies}) == 1
        provider = await deliver(db, async_engine)
    assert len(provider.sent) == 1


async def test_verifications_are_tenant_scoped(db):
    _, key_a = new_tenant(db, "a")
    _, key_b = new_tenant(db, "b")
    async with api_client(db, key_a) as a, api_client(db, key_b) as b:
        v = (await request(a)).json()
        assert (await b.get(f"/v1/email-verifications/{v['id']}")).status_code == 404
        confirm = await b.post(f"/v1/email-verifications/{v['id']}/confirm", json={"token": "x"})
        assert confirm.status_code == 404
        # The same address and key in another tenant is another verification.
        other = await request(b)
        assert other.status_code == 201 and other.json()["id"] != v["id"]


async def test_bad_verification_input(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        assert (await request(api, "not-an-address")).status_code == 422
        assert (await request(api, "a@b.com\r\nBcc: x@y")).status_code == 422
        assert (await request(api, template="missing")).status_code == 422
        assert (await request(api, redirect_url="javascript:alert(1)")).status_code == 422
        r = await api.post(
            "/v1/email-verifications",
            json={"email": "a@b.com", "x": 1},
            headers={"Idempotency-Key": "k"},
        )
        assert r.status_code == 422
        assert (await api.get(f"/v1/email-verifications/{uuid.uuid4()}")).status_code == 404


async def test_a_suppressed_address_fails_its_verification_at_once(db):
    from mailbag.store import suppressions
    from mailbag.store.plan import run as run_plan

    tenant_id, key = new_tenant(db)
    with db.engine.begin() as conn:
        run_plan(
            conn,
            suppressions.add(
                tenant_id=tenant_id,
                email="new.user@example.com",
                reason="hard_bounce",
                now=datetime.now(UTC),
            ),
        )
    async with api_client(db, key) as api:
        v = (await request(api)).json()
    assert v["state"] == "send_failed"
    assert get(db, uuid.UUID(v["message_id"])).last_error == "suppressed"
