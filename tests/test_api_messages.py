"""`/v1/messages` through the real app, on each database: idempotency, isolation, errors."""

from __future__ import annotations

import asyncio
import json

import pytest
from sqlalchemy import update

from api_helpers import api_client, new_tenant
from mailbag.services.idempotency import check_key
from mailbag.store.database import make_async_engine
from mailbag.store.schema import idempotency_records

from helpers import count_rows

BODY = {"to": "Ada@Example.COM", "template": "welcome", "data": {"name": "Ada"}}


async def test_create_read_and_list_a_message(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        created = await api.post("/v1/messages", json=BODY)
        assert created.status_code == 201, created.text
        message = created.json()
        assert message["status"] == "pending" and message["to"] == "Ada@example.com"
        fetched = await api.get(f"/v1/messages/{message['id']}")
        assert fetched.status_code == 200
        assert [e["to"] for e in fetched.json()["events"]] == ["pending"]
        assert "claim_token" not in fetched.json()
        listed = await api.get("/v1/messages", params={"status": "pending"})
        assert [m["id"] for m in listed.json()["items"]] == [message["id"]]
        by_recipient = await api.get("/v1/messages", params={"to": "ada@EXAMPLE.com"})
        assert len(by_recipient.json()["items"]) == 1


async def test_cursor_pagination_walks_every_message_once(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        for i in range(7):
            r = await api.post("/v1/messages", json={**BODY, "to": f"u{i}@example.com"})
            assert r.status_code == 201
        seen, cursor = [], None
        while True:
            params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
            page = (await api.get("/v1/messages", params=params)).json()
            seen += [m["to"] for m in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [f"u{i}@example.com" for i in reversed(range(7))]
        bad = await api.get("/v1/messages", params={"cursor": "!!not-a-cursor"})
        assert bad.status_code == 400


async def test_the_same_key_and_body_replay_the_first_answer(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        first = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "k-1"})
        again = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "k-1"})
        assert first.status_code == again.status_code == 201
        assert first.json() == again.json()
        assert "Idempotent-Replayed" not in first.headers
        assert again.headers["Idempotent-Replayed"] == "true"
        other = await api.post(
            "/v1/messages",
            json={**BODY, "data": {"name": "Eve"}},
            headers={"Idempotency-Key": "k-1"},
        )
        assert other.status_code == 409
        assert other.headers["content-type"] == "application/problem+json"
        assert other.json()["type"].endswith("/idempotency-key-reused")
    assert count_rows(db) == (1, 1)


async def test_concurrent_identical_requests_make_one_message(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        replies = await asyncio.gather(
            *(
                api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "burst"})
                for _ in range(20)
            )
        )
    assert {r.status_code for r in replies} == {201}
    assert len({r.json()["id"] for r in replies}) == 1
    assert count_rows(db) == (1, 1)


async def test_tenants_are_isolated(db):
    _, key_a = new_tenant(db, "a")
    _, key_b = new_tenant(db, "b")
    async with api_client(db, key_a) as a, api_client(db, key_b) as b:
        mine = (await a.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "k"})).json()
        # Another tenant can neither read it, list it, cancel it nor replay its key.
        assert (await b.get(f"/v1/messages/{mine['id']}")).status_code == 404
        assert (await b.get("/v1/messages")).json()["items"] == []
        assert (await b.post(f"/v1/messages/{mine['id']}/cancel")).status_code == 404
        theirs = await b.post(
            "/v1/messages", json={**BODY, "data": {"name": "B"}}, headers={"Idempotency-Key": "k"}
        )
        assert theirs.status_code == 201 and theirs.json()["id"] != mine["id"]
        assert "Idempotent-Replayed" not in theirs.headers


async def test_cancel_only_while_pending(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        message = (await api.post("/v1/messages", json=BODY)).json()
        cancelled = await api.post(f"/v1/messages/{message['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        again = await api.post(f"/v1/messages/{message['id']}/cancel")
        assert again.status_code == 409 and again.json()["status_now"] == "cancelled"


async def test_authentication_is_required(db):
    new_tenant(db)
    async with api_client(db) as api:
        for headers in ({}, {"Authorization": "Bearer mb_wrong"}, {"Authorization": "Basic x"}):
            r = await api.get("/v1/messages", headers=headers)
            assert r.status_code == 401
            assert r.headers["content-type"] == "application/problem+json"
            assert r.json()["type"].endswith("/unauthorized")


@pytest.mark.parametrize(
    ("request_kwargs", "status", "slug"),
    [
        (
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            400,
            "invalid-json",
        ),
        ({"json": {**BODY, "unexpected": 1}}, 422, "validation-error"),
        ({"json": {**BODY, "data": "not an object"}}, 422, "validation-error"),
        ({"json": {**BODY, "to": "x@y\r\nBcc: z@w"}}, 422, "invalid-message"),
        ({"json": {**BODY, "subject": "hi\nBcc: evil@example.com"}}, 422, "invalid-message"),
        ({"json": {**BODY, "headers": {"X-A": "1\r\nBcc: z@w"}}}, 422, "invalid-message"),
        ({"json": {**BODY, "template": "nope"}}, 422, "invalid-message"),
        ({"json": {**BODY, "to": "not-an-address"}}, 422, "invalid-message"),
        ({"json": {**BODY, "subject": "s" * 501}}, 422, "validation-error"),
        (
            {"content": b"to=a", "headers": {"content-type": "text/plain"}},
            415,
            "unsupported-media-type",
        ),
        ({"json": {**BODY, "data": {"blob": "x" * 300_000}}}, 422, "invalid-message"),
        # The messages endpoint takes bodies as large as a message at the limits needs.
        ({"json": {**BODY, "text": "x" * 23_000_000}}, 413, "body-too-large"),
        ({"json": BODY, "headers": {"Idempotency-Key": ""}}, 400, "invalid-idempotency-key"),
        ({"json": BODY, "headers": {"Idempotency-Key": "k" * 256}}, 400, "invalid-idempotency-key"),
    ],
)
async def test_bad_input_is_a_problem_and_writes_nothing(db, request_kwargs, status, slug):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        r = await api.post("/v1/messages", **request_kwargs)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"].endswith("/" + slug)
    assert count_rows(db) == (0, 0)


def test_idempotency_keys_are_printable_ascii():
    assert check_key("abc-123 ~!") == "abc-123 ~!"
    for bad in ("", "é", "tab\there", "x" * 256):
        with pytest.raises(ValueError):
            check_key(bad)


async def test_a_database_outage_is_a_503_with_retry_after(db, tmp_path):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        # The database goes away: every engine the app holds now points at a closed port.
        services = api._transport.app.state.services
        services.engine = services.messages.engine = make_async_engine(
            "postgresql://nobody@127.0.0.1:1/none"
        )
        r = await api.post("/v1/messages", json=BODY)
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    assert r.json()["type"].endswith("/database-unavailable")
    assert "Traceback" not in r.text


async def test_a_replay_is_byte_identical_to_the_first_answer(db):
    # Key orders that differ from sorted (a, bbb, cc) and from JSONB's (a, cc, bbb): JSONB
    # sorts keys by length, then bytes. 1e20 comes back from JSONB as an integer.
    data = {"bbb": 1, "a": {"zz": [3, {"y": 1, "x": 2}], "b": 1e20}, "cc": 1.0, "name": "Zoë"}
    body = {**BODY, "data": data, "metadata": {"zeta": 1, "a": 2, "mm": 3}}
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        first = await api.post("/v1/messages", json=body, headers={"Idempotency-Key": "bytes"})
        again = await api.post("/v1/messages", json=body, headers={"Idempotency-Key": "bytes"})
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert list(first.json()["data"]) == ["bbb", "a", "cc", "name"]


async def test_a_record_stored_before_bodies_were_kept_as_text_still_replays(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        first = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "old"})
        # As older versions stored it: the body as a JSON object, not its text.
        with db.engine.begin() as conn:
            conn.execute(update(idempotency_records).values(response_body=first.json()))
        again = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "old"})
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()


async def test_an_answer_stored_before_messages_carried_more_still_replays(db):
    _, key = new_tenant(db)
    new_fields = [
        "recipients",
        "reply_to",
        "from_name",
        "ready_made",
        "has_html",
        "has_text",
        "attachments",
        "priority",
        "expires_at",
        "unsubscribe_url",
        "unsubscribe_mailto",
        "suppressed",
    ]
    async with api_client(db, key) as api:
        first = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "older"})
        old_body = {k: v for k, v in first.json().items() if k not in new_fields}
        for stored in (old_body, json.dumps(old_body)):  # as an object, and as text
            with db.engine.begin() as conn:
                conn.execute(update(idempotency_records).values(response_body=stored))
            again = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "older"})
            assert again.status_code == 201, again.text
            assert again.headers["Idempotent-Replayed"] == "true"
            assert again.json()["id"] == first.json()["id"]


def test_a_plain_message_keeps_the_fingerprint_it_had_before_messages_carried_more():
    from mailbag.domain.message import new_message
    from mailbag.services.idempotency import fingerprint
    from mailbag.services.messages import message_fingerprint

    message = new_message(to="Ada@Example.COM", to_name="Ada", template="welcome", data={"n": 1})
    before = fingerprint(  # the fields, as the fingerprint was computed before
        "POST /v1/messages",
        {
            "to": "ada@example.com",
            "to_name": "Ada",
            "template": "welcome",
            "data": {"n": 1},
            "subject": None,
            "send_at": None,
            "tags": [],
            "metadata": {},
            "headers": {},
        },
    )
    assert message_fingerprint(message) == before
    with_cc = new_message(to="ada@example.com", cc=["b@example.com"], template="welcome")
    assert message_fingerprint(with_cc) != message_fingerprint(
        new_message(to="ada@example.com", template="welcome")
    )
