"""Input at the HTTP boundary, on each database: what validation accepts the database stores,
what it cannot store is a 422 that writes nothing, and no log line quotes the request."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import func, select

from api_helpers import api_client, new_tenant
from mailbag.api import admin, schemas
from mailbag.domain import storable
from mailbag.store.schema import (
    email_verifications,
    idempotency_records,
    message_attachments,
    message_events,
    outbox_messages,
    suppressions,
    tenant_senders,
)

from conftest import TestDB

MARK = "marker-5f2c9e"  # in every bad request's data: it must not reach a log line
KEY = "idem-key-7b1d40"
BODY = {"to": "ada@example.com", "template": "welcome", "data": {"name": "Ada", "m": MARK}}


def raw(body: dict[str, Any]) -> bytes:
    # ensure_ascii: lone surrogates and NUL travel as \\udXXX / \\u0000 escapes, as a client sends.
    return json.dumps(body).encode()


def nested(depth: int, leaf: Any = MARK) -> Any:
    value = leaf
    for i in range(depth):
        value = {f"k{i}": value} if i % 2 else [value]
    return value


def counts(db: TestDB) -> dict[str, int]:
    with db.engine.connect() as conn:
        return {
            table.name: conn.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (outbox_messages, message_events, idempotency_records, email_verifications)
        }


NOTHING = {
    "outbox_messages": 0,
    "message_events": 0,
    "idempotency_records": 0,
    "email_verifications": 0,
}


def logged(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> str:
    out, err = capsys.readouterr()
    return out + err + caplog.text


# Top-level string fields: pydantic itself refuses lone surrogates (string_unicode); inside
# containers (data, metadata, headers, tags) it does not, so mailbag's own rule must.
MESSAGE_CASES = {
    "nul in a data value": ({"data": {"name": "Ada", "note": MARK + "\x00"}}, "unstorable_text"),
    "nul in a data key": ({"data": {"name": "Ada", MARK + "\x00": 1}}, "unstorable_text"),
    "lone surrogate in a data value": ({"data": {"name": MARK + "\ud800"}}, "unstorable_text"),
    "lone surrogate in a metadata key": ({"metadata": {"\udc00" + MARK: 1}}, "unstorable_text"),
    "nul deep in metadata": ({"metadata": {"a": [{"b": MARK + "\x00"}]}}, "unstorable_text"),
    "lone surrogate in the subject": ({"subject": "Hi \ud83d"}, "string_unicode"),
    "lone surrogate in to_name": ({"to_name": "Ada \udfff"}, "string_unicode"),
    "lone surrogate in a header": ({"headers": {"X-Note": "\udfff"}}, "unstorable_text"),
    "lone surrogate in a tag": ({"tags": ["ok", "\ud800"]}, "unstorable_text"),
    "nul in a tag": ({"tags": ["a\x00b"]}, "unstorable_text"),
    "send_at year 1 with an offset": ({"send_at": "0001-01-01T00:00:00+01:00"}, "unstorable_time"),
    "send_at year 9999 with an offset": (
        {"send_at": "9999-12-31T23:59:59-01:00"},
        "unstorable_time",
    ),
    "send_at year 1 in UTC": ({"send_at": "0001-01-01T00:00:00Z"}, "unstorable_time"),
    "data 300 levels deep": ({"data": {"name": "Ada", "deep": nested(300)}}, "too_deep"),
    "data one level too deep": (
        {"data": {"deep": nested(storable.MAX_JSON_DEPTH)}},
        "too_deep",
    ),
    "metadata one level too deep": (
        {"metadata": {"deep": nested(storable.MAX_JSON_DEPTH)}},
        "too_deep",
    ),
}


async def refused_unwritten_unlogged(
    db: TestDB, logs: Any, path: str, body: dict[str, Any], error: str
) -> None:
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        r = await api.post(
            path,
            content=raw(body),
            headers={"content-type": "application/json", "Idempotency-Key": KEY},
        )
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"].endswith("/validation-error")
    assert error in [e["type"] for e in r.json()["errors"]]
    assert counts(db) == NOTHING
    text = logs()
    assert MARK not in text and KEY not in text


@pytest.mark.parametrize(("fields", "error"), MESSAGE_CASES.values(), ids=MESSAGE_CASES.keys())
async def test_a_message_the_database_cannot_store_is_a_422_that_writes_and_logs_nothing(
    db, capsys, caplog, fields, error
):
    body = {**BODY, **fields}
    await refused_unwritten_unlogged(
        db, lambda: logged(capsys, caplog), "/v1/messages", body, error
    )


VERIFICATION_CASES = {
    "a 2,001-character redirect_url": (
        {"redirect_url": "https://example.com/" + "a" * 1981},
        "url_too_long",
    ),
    "a redirect_url over the limit once percent-encoded": (
        {"redirect_url": "https://example.com/" + "é" * 1000},
        "url_too_long",
    ),
    "nul in data": ({"data": {"note": MARK + "\x00"}}, "unstorable_text"),
    "lone surrogate in a data key": ({"data": {MARK + "\ud800": 1}}, "unstorable_text"),
    "data too deep": ({"data": {"deep": nested(300)}}, "too_deep"),
}


@pytest.mark.parametrize(
    ("fields", "error"), VERIFICATION_CASES.values(), ids=VERIFICATION_CASES.keys()
)
async def test_a_verification_the_database_cannot_store_is_a_422_that_writes_and_logs_nothing(
    db, capsys, caplog, fields, error
):
    body = {"email": "reader@example.com", "data": {"m": MARK}, **fields}
    await refused_unwritten_unlogged(
        db, lambda: logged(capsys, caplog), "/v1/email-verifications", body, error
    )


async def test_what_the_rules_accept_is_stored_and_read_back_exactly(db):
    _, key = new_tenant(db)
    data = {
        "name": "Zoë 🎉 \U0001f600",  # astral characters: surrogate *pairs* in JSON
        "deep": nested(storable.MAX_JSON_DEPTH - 1, "leaf"),
    }
    body = {
        **BODY,
        "data": data,
        "metadata": {"ref": "\U0001f4e7"},
        "subject": "Grüße 😀",
        "send_at": "9999-12-31T22:59:59-01:00",  # the latest time every database stores
    }
    async with api_client(db, key) as api:
        created = await api.post(
            "/v1/messages", content=raw(body), headers={"content-type": "application/json"}
        )
        assert created.status_code == 201, created.text
        message_id = created.json()["id"]
        fetched = await api.get(f"/v1/messages/{message_id}")
        listed = await api.get("/v1/messages")
    assert fetched.status_code == 200 and listed.status_code == 200
    assert fetched.json()["data"] == data
    assert fetched.json()["subject"] == "Grüße 😀"
    assert fetched.json()["next_attempt_at"].startswith("9999-12-31T23:59:59")
    assert [m["data"] for m in listed.json()["items"]] == [data]


def test_request_length_limits_fit_the_columns_they_are_stored_in():
    def limit(model: type[Any], field: str) -> int:
        (found,) = [
            m.max_length for m in model.model_fields[field].metadata if hasattr(m, "max_length")
        ]
        return int(found)

    pairs = [
        (schemas.AddressIn, "address", outbox_messages.c.to_address),
        (schemas.AddressIn, "name", outbox_messages.c.to_name),
        (schemas.MessageCreate, "to_name", outbox_messages.c.to_name),
        (schemas.MessageCreate, "from_", outbox_messages.c.from_address),
        (schemas.AttachmentIn, "filename", message_attachments.c.filename),
        (schemas.AttachmentIn, "content_type", message_attachments.c.content_type),
        (schemas.AttachmentIn, "content_id", message_attachments.c.content_id),
        (admin.SenderIn, "address", tenant_senders.c.address),
        (admin.SenderIn, "name", tenant_senders.c.name),
        (schemas.MessageCreate, "subject", outbox_messages.c.subject),
        (schemas.MessageCreate, "template", outbox_messages.c.template_name),
        (schemas.VerificationCreate, "email", email_verifications.c.email),
        (schemas.VerificationCreate, "template", email_verifications.c.template_name),
        (admin.Resolution, "evidence", message_events.c.detail),
        (admin.Resolution, "provider_message_id", outbox_messages.c.provider_message_id),
        (admin.SuppressionIn, "tenant_id", suppressions.c.tenant_id),
        (admin.SuppressionIn, "email", suppressions.c.email),
        (admin.SuppressionIn, "detail", suppressions.c.detail),
    ]
    for model, field, column in pairs:
        assert limit(model, field) <= column.type.length, (model.__name__, field)
    assert email_verifications.c.redirect_url.type.length == schemas.REDIRECT_URL_MAX


def log_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


async def chunks(total: int, size: int = 16 * 1024) -> Any:
    sent = 0
    while sent < total:
        yield b" " * min(size, total - sent)
        sent += size


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_a_streamed_body_over_the_limit_is_a_413_like_a_declared_one(db):
    _, key = new_tenant(db)
    # Messages as small as 1 KiB: their body allowance falls below the 300 KiB streamed.
    async with api_client(db, key, max_message_bytes=1024) as api:
        # No Content-Length: httpx streams a generator with Transfer-Encoding: chunked.
        too_big = await api.post(
            "/v1/messages",
            content=chunks(300 * 1024),
            headers={"content-type": "application/json"},
        )
        body = json.dumps(BODY).encode()

        async def small() -> Any:
            yield body[:10]
            yield body[10:]

        fine = await api.post(
            "/v1/messages", content=small(), headers={"content-type": "application/json"}
        )
    assert too_big.status_code == 413, too_big.text
    assert too_big.headers["content-type"] == "application/problem+json"
    assert too_big.json()["type"].endswith("/body-too-large")
    assert fine.status_code == 201, fine.text
    assert counts(db)["outbox_messages"] == 1


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_an_unhandled_error_is_a_logged_500_with_the_request_id(db, capsys, caplog):
    _, key = new_tenant(db)

    async def broken(**_: Any) -> Any:
        raise RuntimeError(f"boom {MARK}")

    async with api_client(db, key) as api:
        api._transport.app.state.services.messages.create = broken  # type: ignore[attr-defined]
        r = await api.post(
            "/v1/messages", json=BODY, headers={"Idempotency-Key": KEY, "X-Request-ID": "req-500"}
        )
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["X-Request-ID"] == "req-500"
    assert r.json()["type"].endswith("/internal-error")
    assert "Traceback" not in r.text and "boom" not in r.text
    logs = logged(capsys, caplog)
    lines = log_lines(logs)
    access = [line for line in lines if line["event"] == "request"]
    assert [(a["status"], a["request_id"], a["path"]) for a in access] == [
        (500, "req-500", "/v1/messages")
    ]
    (error,) = [line for line in lines if line["event"] == "unhandled_error"]
    assert error["request_id"] == "req-500" and error["error"] == "RuntimeError"
    assert "broken" in error["stack"]  # where it happened, for whoever reads the log
    assert MARK not in logs and KEY not in logs


async def test_a_database_error_is_logged_without_the_request_s_values(
    db, capsys, caplog, monkeypatch
):
    # Past validation (its rule switched off here), the database layer refuses the values;
    # its error message would quote the statement's parameters and the refused JSON.
    monkeypatch.setattr(storable, "check", lambda *_, **__: None)
    monkeypatch.setattr(storable, "time_problem", lambda *_: None)
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        overflow = await api.post(
            "/v1/messages",
            json={**BODY, "send_at": "0001-01-01T00:00:00+01:00"},
            headers={"Idempotency-Key": KEY},
        )
        surrogate = await api.post(
            "/v1/messages",
            content=raw({**BODY, "data": {"name": "Ada", "m": MARK + "\ud800"}}),
            headers={"content-type": "application/json", "Idempotency-Key": KEY + "-2"},
        )
    assert overflow.status_code == 500, overflow.text
    if db.dialect == "postgresql":  # JSONB refuses a lone surrogate, quoting the JSON around it
        assert surrogate.status_code == 500, surrogate.text
    logs = logged(capsys, caplog)
    assert MARK not in logs and KEY not in logs
    assert "ada@example.com" not in logs
    errors = [line for line in log_lines(logs) if line["event"] == "unhandled_error"]
    assert errors and all("stack" in line for line in errors)


ADMIN_TOKEN = "admin-token-0123456789"


@pytest.mark.parametrize(
    "body",
    [
        {"tenant_id": "t", "email": "x@example.com", "detail": MARK + "\x00"},
        {"tenant_id": "t\x00" + MARK, "email": "x@example.com"},
        {"tenant_id": "t", "email": "x@example.com", "detail": "\ud800" + MARK},
    ],
    ids=["nul in detail", "nul in tenant_id", "lone surrogate in detail"],
)
async def test_the_admin_api_refuses_what_cannot_be_stored_like_the_tenant_api(
    db, capsys, caplog, body
):
    async with api_client(db, admin_token=ADMIN_TOKEN) as api:
        r = await api.post(
            "/v1/admin/suppressions",
            content=raw(body),
            headers={"content-type": "application/json", "Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
    assert r.status_code == 422, r.text
    assert r.json()["type"].endswith("/validation-error")
    with db.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(suppressions)).scalar_one() == 0
    assert MARK not in logged(capsys, caplog)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/messages?cursor=a%00b"),
        ("GET", "/v1/admin/messages?tenant_id=a%00b"),
        ("GET", "/v1/admin/messages?template=a%00b"),
        ("GET", "/v1/admin/suppressions?tenant_id=a%00"),
        ("DELETE", "/v1/admin/suppressions/t%00/x@example.com"),
    ],
)
async def test_a_nul_in_a_query_or_path_parameter_is_a_422(db, method, path):
    _, key = new_tenant(db)
    async with api_client(db, key, admin_token=ADMIN_TOKEN) as api:
        token = ADMIN_TOKEN if "/admin/" in path else key
        r = await api.request(method, path, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 422, r.text
    assert r.json()["type"].endswith("/validation-error")
    assert [e["type"] for e in r.json()["errors"]] == ["unstorable_text"]
