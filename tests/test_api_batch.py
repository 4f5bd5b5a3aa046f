"""POST /v1/messages/batch through the real app, on each database: one result per item in
order, bad items refused alone, idempotent as a whole, limits, hostile bodies."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from api_helpers import api_client, new_tenant
from mailbag.services.tenants import add_sender

from helpers import count_rows

PROBLEMS = "https://mailbag.dev/problems/"


def item(i: int, **fields: Any) -> dict[str, Any]:
    return {
        "to": f"user{i}@example.com",
        "template": "welcome",
        "data": {"name": f"U{i}"},
        **fields,
    }


async def test_a_batch_writes_every_message_and_answers_one_result_each_in_order(db):
    _, key = new_tenant(db)
    items = [item(i) for i in range(5)]
    async with api_client(db, key) as api:
        answer = await api.post("/v1/messages/batch", json={"messages": items})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["created"], body["existing"], body["invalid"]) == (5, 0, 0)
        assert [r["index"] for r in body["results"]] == [0, 1, 2, 3, 4]
        assert [r["result"] for r in body["results"]] == ["created"] * 5
        assert [r["message"]["to"] for r in body["results"]] == [i["to"] for i in items]
        first = body["results"][0]["message"]
        fetched = await api.get(f"/v1/messages/{first['id']}")
        assert fetched.status_code == 200 and fetched.json()["data"] == {"name": "U0"}
    assert count_rows(db) == (5, 5)


async def test_a_batchs_messages_are_bulk_mail_unless_an_item_says_not(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        answer = await api.post(
            "/v1/messages/batch", json={"messages": [item(0), item(1, bulk=False)]}
        )
        assert answer.status_code == 200, answer.text
        assert [r["message"]["bulk"] for r in answer.json()["results"]] == [True, False]
        single = await api.post("/v1/messages", json=item(2))
        assert single.status_code == 201 and single.json()["bulk"] is False
        marked = await api.post("/v1/messages", json=item(3, bulk=True))
        fetched = await api.get(f"/v1/messages/{marked.json()['id']}")
        assert fetched.json()["bulk"] is True


async def test_bad_items_get_their_own_problem_and_the_good_ones_are_written(db):
    tenant_id, key = new_tenant(db)
    add_sender(db.engine, tenant_id, "billing@acme.example", "Billing")
    big = base64.b64encode(b"x" * 2048).decode()
    items: list[Any] = [
        item(0),
        item(1, to="not-an-address"),  # new_message refuses it
        {**item(2), "colour": "red"},  # the schema refuses it (unknown field)
        None,  # not even an object
        item(4, template="no-such-template"),
        item(5, **{"from": "someone@else.example"}),  # not the tenant's sender identity
        item(6, **{"from": "billing@acme.example"}),  # is
        item(7, attachments=[{"filename": "a.bin", "content": big}]),  # over the limit
        item(8, data={}),  # the template needs `name`
        item(9, idempotency_key="k-9"),
        item(10, idempotency_key="k-9"),  # the same key twice in one batch
    ]
    async with api_client(db, key, max_attachment_bytes=1024) as api:
        answer = await api.post("/v1/messages/batch", json={"messages": items})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    results = body["results"]
    assert [r["index"] for r in results] == list(range(len(items)))
    created = [r["index"] for r in results if r["result"] == "created"]
    assert created == [0, 6, 9]
    assert (body["created"], body["existing"], body["invalid"]) == (3, 0, 8)
    errors = {r["index"]: r["error"] for r in results if r["result"] == "invalid"}
    assert all(r["message"] is None for r in results if r["result"] == "invalid")
    assert errors[1]["type"] == PROBLEMS + "invalid-message" and "to" in errors[1]["errors"]
    assert errors[2]["type"] == PROBLEMS + "validation-error" and errors[2]["status"] == 422
    assert errors[2]["errors"][0]["loc"] == ["colour"]
    assert "red" not in json.dumps(errors[2])  # the input is not echoed
    assert errors[3]["type"] == PROBLEMS + "validation-error"
    assert "template" in errors[4]["errors"]
    assert "sender identity" in errors[5]["errors"]["from"]
    assert errors[7]["type"] == PROBLEMS + "message-too-large" and errors[7]["status"] == 413
    assert "does not render" in errors[8]["errors"]["template"]
    assert "item 9" in errors[10]["errors"]["idempotency_key"]
    assert results[6]["message"]["from"] == "billing@acme.example"
    assert count_rows(db)[0] == 3


async def test_the_same_key_and_body_replay_the_answer_and_another_body_is_a_409(db):
    _, key = new_tenant(db)
    batch = {"messages": [item(0), item(1, to="bad")]}
    headers = {"Idempotency-Key": "batch-1"}
    async with api_client(db, key) as api:
        first = await api.post("/v1/messages/batch", json=batch, headers=headers)
        again = await api.post("/v1/messages/batch", json=batch, headers=headers)
        other = await api.post(
            "/v1/messages/batch", json={"messages": [item(0), item(2)]}, headers=headers
        )
    assert first.status_code == again.status_code == 200
    assert again.content == first.content
    assert again.headers.get("idempotent-replayed") == "true"
    assert "idempotent-replayed" not in first.headers
    assert other.status_code == 409
    assert other.headers["content-type"] == "application/problem+json"
    assert other.json()["type"] == PROBLEMS + "idempotency-key-reused"
    assert count_rows(db)[0] == 1


async def test_an_item_key_a_message_holds_answers_existing_with_that_message(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        single = await api.post("/v1/messages", json=item(0), headers={"Idempotency-Key": "w-0"})
        assert single.status_code == 201
        answer = await api.post(
            "/v1/messages/batch",
            json={"messages": [item(0, idempotency_key="w-0"), item(1, idempotency_key="w-1")]},
        )
        again = await api.post(
            "/v1/messages/batch", json={"messages": [item(1, idempotency_key="w-1")]}
        )
    results = answer.json()["results"]
    assert [r["result"] for r in results] == ["existing", "created"]
    assert results[0]["message"]["id"] == single.json()["id"]
    assert again.json()["results"][0]["result"] == "existing"
    assert again.json()["results"][0]["message"]["id"] == results[1]["message"]["id"]
    assert count_rows(db)[0] == 2


@pytest.mark.parametrize(
    ("body", "status", "problem"),
    [
        ({"messages": [item(i) for i in range(1001)]}, 422, "validation-error"),
        ({"messages": []}, 422, "validation-error"),
        ({"messages": item(0)}, 422, "validation-error"),
        ({}, 422, "validation-error"),
        ([item(0)], 422, "validation-error"),
        ({"messages": [item(0)], "extra": 1}, 422, "validation-error"),
        ("null", 422, "validation-error"),
    ],
    ids=["1001-items", "none", "not-a-list", "no-messages", "a-bare-list", "extra", "null"],
)
async def test_a_bad_envelope_refuses_the_whole_batch(db, body, status, problem):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        content = body if isinstance(body, str) else json.dumps(body)
        answer = await api.post(
            "/v1/messages/batch", content=content, headers={"Content-Type": "application/json"}
        )
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["type"] == PROBLEMS + problem
    assert count_rows(db) == (0, 0)


async def test_a_thousand_items_are_one_batch(db):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        answer = await api.post(
            "/v1/messages/batch", json={"messages": [item(i) for i in range(1000)]}
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["created"] == 1000
    assert count_rows(db) == (1000, 1000)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"messages": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
        b'{"messages": [{"to": "a@example.com", "template": "welcome", "data": '
        + b'{"a":' * 40
        + b"1"
        + b"}" * 40
        + b"}]}",
        b'{"messages": [{"to": "a\\u0000@example.com", "template": "welcome"}]}',
        b'{"messages": [{"to": "\\ud800@example.com", "template": "welcome"}]}',
        b'{"messages": [{"to": "a@example.com", "template": "welcome", '
        b'"send_at": "9999-12-31T23:59:59-05:00"}]}',
        b'{"messages": [{"to": "a@example.com", "template": "welcome", "priority": 1e400}]}',
        b'{"messages": [{"to": ["a@example.com"], "cc": {"address": 5}, "template": "welcome"}]}',
        b'{"messages": [{"to": "a@example.com", "idempotency_key": "\\u00e9"}]}',
        b'{"messages": ' + b"[1," * 2000 + b"1" + b"]" * 2000 + b"}",
        b"\xff\xfe",
        b'{"messages": [{"to": "a@example.com", "template": "welcome", "data": {"name": '
        + b"9" * 5000
        + b"}}]}",
        b'{"messages": [{"to": "a@example.com", "template": "welcome", '
        b'"data": {"name": "A", "x": 1e400}}]}',
        b'{"messages": [{"to": "a@example.com", "template": "welcome", "data": {"name": "A"}, '
        b'"send_at": "2026-01-01T00:00:00"}]}',
        b'{"messages": [{"to": ' + json.dumps(["a@example.com"] * 60).encode() + b"}]}",
    ],
    ids=[
        "not-json",
        "deep-item",
        "deep-data",
        "nul",
        "surrogate",
        "year-10000",
        "huge-number",
        "wrong-types",
        "non-ascii-key",
        "deep-list",
        "not-utf8",
        "huge-int",
        "infinity",
        "naive-time",
        "sixty-recipients",
    ],
)
async def test_hostile_bodies_get_a_4xx_problem_never_a_500(db, content):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        answer = await api.post(
            "/v1/messages/batch", content=content, headers={"Content-Type": "application/json"}
        )
    # The whole request refused, or its one item.
    if answer.status_code == 200:
        assert answer.json()["invalid"] == 1 and answer.json()["results"][0]["error"]["status"]
    else:
        assert 400 <= answer.status_code < 500, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
    assert count_rows(db) == (0, 0)


async def test_a_body_over_the_limit_is_a_413_and_a_batch_needs_a_key(db):
    _, key = new_tenant(db)
    # The batch's limit is what one message at the limits needs.
    async with api_client(db, key, max_message_bytes=1024, max_body_bytes=1024) as api:
        huge = {"messages": [item(i, data={"name": "x" * 1000}) for i in range(100)]}
        too_large = await api.post("/v1/messages/batch", json=huge)
        fits = await api.post("/v1/messages/batch", json={"messages": [item(0)]})
    assert too_large.status_code == 413, too_large.text
    assert too_large.json()["type"] == PROBLEMS + "body-too-large"
    assert fits.status_code == 200
    async with api_client(db) as anonymous:
        refused = await anonymous.post("/v1/messages/batch", json={"messages": [item(0)]})
    assert refused.status_code == 401
    assert count_rows(db)[0] == 1


async def test_the_openapi_schema_documents_the_items(db):
    async with api_client(db) as api:
        spec = (await api.get("/openapi.json")).json()
    operation = spec["paths"]["/v1/messages/batch"]["post"]
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    envelope = spec["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    items = envelope["properties"]["messages"]["items"]["$ref"].rsplit("/", 1)[-1]
    assert "idempotency_key" in spec["components"]["schemas"][items]["properties"]
    assert "to" in spec["components"]["schemas"][items]["properties"]
