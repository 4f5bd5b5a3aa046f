"""What a message can carry, through the HTTP API on each database: every field reads back,
bad input is a clear 4xx that writes nothing, sender identities, idempotent attachments."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from sqlalchemy import func, select

from api_helpers import api_client, new_tenant
from mailbag.services.tenants import add_sender
from mailbag.store.schema import attachments, message_attachments, outbox_messages

from conftest import TestDB

ADMIN_TOKEN = "admin-token-0123456789-abcdef"
PDF = b"%PDF-1.4\n" + bytes(range(256)) * 40 + b"\n%%EOF\n"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x01" * 300


def b64(content: bytes) -> str:
    return base64.b64encode(content).decode()


def full_body() -> dict[str, Any]:
    return {
        "to": [{"address": "ada@example.com", "name": "Ada Lovelace"}, "charles@example.com"],
        "cc": ["accounts@example.com"],
        "bcc": [{"address": "archive@example.com"}],
        "reply_to": [{"address": "billing@acme.example", "name": "Acme Billing"}],
        "from": "billing@acme.example",
        "from_name": "Acme Billing",
        "subject": "Your invoice #2041",
        "html": '<p><img src="cid:logo"></p><p>Your invoice is attached.</p>',
        "attachments": [
            {"filename": "invoice.pdf", "content_type": "application/pdf", "content": b64(PDF)},
            {"filename": "logo.png", "content": b64(PNG), "content_id": "logo"},
        ],
        "expires_at": "2030-01-01T00:00:00Z",
        "priority": "high",
        "unsubscribe_url": "https://acme.example/unsubscribe?u=42",
        "unsubscribe_mailto": "unsubscribe@acme.example",
    }


def counts(db: TestDB) -> tuple[int, int, int]:
    with db.engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (outbox_messages, attachments, message_attachments)
        )


def acme(db: TestDB) -> tuple[str, str]:
    """A tenant that owns billing@acme.example."""
    tenant_id, key = new_tenant(db)
    add_sender(db.engine, tenant_id, "billing@acme.example", "Acme Billing")
    return tenant_id, key


async def test_the_whole_model_reads_back(db):
    _, key = acme(db)
    async with api_client(db, key) as api:
        created = await api.post("/v1/messages", json=full_body())
        assert created.status_code == 201, created.text
        fetched = await api.get(f"/v1/messages/{created.json()['id']}")
        listed = await api.get("/v1/messages")
        cancelled = await api.post(f"/v1/messages/{created.json()['id']}/cancel")
    message = fetched.json()
    assert listed.json()["items"][0]["attachments"] == message["attachments"]
    assert cancelled.json()["attachments"] == message["attachments"]
    assert fetched.status_code == 200
    assert message == {**created.json(), "events": message["events"]}
    assert message["to"] == "ada@example.com" and message["to_name"] == "Ada Lovelace"
    assert message["recipients"] == {
        "to": [
            {"address": "ada@example.com", "name": "Ada Lovelace"},
            {"address": "charles@example.com", "name": None},
        ],
        "cc": [{"address": "accounts@example.com", "name": None}],
        "bcc": [{"address": "archive@example.com", "name": None}],
    }
    assert message["reply_to"] == [{"address": "billing@acme.example", "name": "Acme Billing"}]
    assert (message["from"], message["from_name"]) == ("billing@acme.example", "Acme Billing")
    assert message["template"] is None and message["ready_made"] is True
    assert message["has_html"] is True and message["has_text"] is True  # text made from html
    assert message["attachments"] == [
        {
            "filename": "invoice.pdf",
            "content_type": "application/pdf",
            "size": len(PDF),
            "sha256": hashlib.sha256(PDF).hexdigest(),
            "content_id": None,
        },
        {
            "filename": "logo.png",
            "content_type": "image/png",  # guessed from the name
            "size": len(PNG),
            "sha256": hashlib.sha256(PNG).hexdigest(),
            "content_id": "logo",
        },
    ]
    assert message["priority"] == "high"
    assert message["expires_at"].startswith("2030-01-01T00:00:00")
    assert message["unsubscribe_url"] == "https://acme.example/unsubscribe?u=42"
    assert message["unsubscribe_mailto"] == "unsubscribe@acme.example"
    assert message["suppressed"] == []
    assert b64(PDF) not in created.text  # no bytes in the answer
    assert counts(db) == (1, 2, 2)
    with db.engine.connect() as conn:
        stored = conn.execute(
            select(attachments.c.content).where(
                attachments.c.sha256 == hashlib.sha256(PDF).hexdigest()
            )
        ).scalar_one()
    assert bytes(stored) == PDF


async def test_a_template_message_reads_back_as_before(db):
    _, key = new_tenant(db)
    body = {"to": "ada@example.com", "to_name": "Ada", "template": "welcome", "data": {"name": "A"}}
    async with api_client(db, key) as api:
        created = await api.post("/v1/messages", json=body)
    message = created.json()
    assert created.status_code == 201, created.text
    assert (message["to"], message["to_name"], message["template"]) == (
        "ada@example.com",
        "Ada",
        "welcome",
    )
    assert message["recipients"] == {
        "to": [{"address": "ada@example.com", "name": "Ada"}],
        "cc": [],
        "bcc": [],
    }
    assert message["ready_made"] is False and message["attachments"] == []
    assert message["priority"] == "normal" and message["from"] is None


def _with(**changes: Any) -> dict[str, Any]:
    body = full_body()
    for name, value in changes.items():
        if value is None:
            body.pop(name)
        else:
            body[name] = value
    return body


BAD = {
    "51 recipients": (
        _with(to=[f"r{i}@example.com" for i in range(49)]),  # + cc + bcc = 51
        422,
        "invalid-message",
        "to",
    ),
    "an attachment over the limit": (
        _with(attachments=[{"filename": "big.bin", "content": b64(b"x" * 20_000)}]),
        413,
        "message-too-large",
        "attachments",
    ),
    "a from the tenant does not own": (
        _with(**{"from": "ceo@acme.example"}),
        422,
        "invalid-message",
        "from",
    ),
    "a cid: with no attachment": (
        _with(html='<img src="cid:missing">'),
        422,
        "invalid-message",
        "html",
    ),
    "invalid base64": (
        _with(attachments=[{"filename": "a.pdf", "content": "not*base64!"}]),
        422,
        "invalid-message",
        "attachments",
    ),
    "base64 with wrong padding": (
        _with(attachments=[{"filename": "a.pdf", "content": "QUJDRA"}]),
        422,
        "invalid-message",
        "attachments",
    ),
    "template and html together": (
        _with(template="welcome", data={"name": "A"}),
        422,
        "invalid-message",
        "template",
    ),
    "an unsubscribe_url that is not https": (
        _with(unsubscribe_url="http://acme.example/unsubscribe"),
        422,
        "invalid-message",
        "unsubscribe_url",
    ),
    "an unknown priority": (_with(priority="urgent"), 422, "validation-error", None),
    "expiry before send_at": (
        _with(send_at="2030-01-02T00:00:00Z"),
        422,
        "invalid-message",
        "expires_at",
    ),
}


@pytest.mark.parametrize(("body", "status", "slug", "field"), BAD.values(), ids=BAD.keys())
async def test_bad_input_is_a_clear_4xx_and_writes_nothing(db, body, status, slug, field):
    _, key = acme(db)
    async with api_client(db, key, max_attachment_bytes=16_384) as api:
        r = await api.post("/v1/messages", json=body, headers={"Idempotency-Key": "bad"})
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"].endswith("/" + slug)
    if field is not None:
        assert field in r.json()["errors"], r.json()
    assert counts(db) == (0, 0, 0)


async def test_a_body_beyond_the_message_allowance_is_a_413(db):
    _, key = new_tenant(db)
    # 4 KiB messages: the body allowance is max_body_bytes (256 KiB) plus what 4 KiB needs.
    async with api_client(db, key, max_message_bytes=4096) as api:
        big = b64(b"x" * 400_000)
        r = await api.post(
            "/v1/messages", json=_with(attachments=[{"filename": "a", "content": big}])
        )
        small = await api.post(
            "/v1/messages",
            json={"to": "a@example.com", "subject": "s", "text": "x" * 3000},
        )
    assert r.status_code == 413 and r.json()["type"].endswith("/body-too-large")
    assert small.status_code == 201, small.text
    assert counts(db) == (1, 0, 0)


async def test_a_message_at_the_limit_gets_through(db):
    _, key = acme(db)
    content = bytes(range(256)) * (10 * 1024 * 1024 // 256 - 64)  # 10 MiB less the bodies' room
    body = _with(attachments=[{"filename": "big.bin", "content": b64(content)}], html="<p>hi</p>")
    async with api_client(db, key) as api:
        r = await api.post("/v1/messages", json=body)
    assert r.status_code == 201, r.text[:500]
    assert r.json()["attachments"][0]["size"] == len(content)


async def test_an_idempotent_replay_with_attachments_returns_the_same_message(db):
    _, key = acme(db)
    headers = {"Idempotency-Key": "invoice-2041"}
    async with api_client(db, key) as api:
        first = await api.post("/v1/messages", json=full_body(), headers=headers)
        again = await api.post("/v1/messages", json=full_body(), headers=headers)
        other_bytes = full_body()
        other_bytes["attachments"][0]["content"] = b64(PDF + b"changed")
        changed = await api.post("/v1/messages", json=other_bytes, headers=headers)
        renamed = full_body()
        renamed["attachments"][0]["filename"] = "other.pdf"
        other_name = await api.post("/v1/messages", json=renamed, headers=headers)
        other_bcc = await api.post(
            "/v1/messages", json=_with(bcc=["x@example.com"]), headers=headers
        )
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    for conflict in (changed, other_name, other_bcc):
        assert conflict.status_code == 409, conflict.text
        assert conflict.json()["type"].endswith("/idempotency-key-reused")
    assert counts(db) == (1, 2, 2)


async def test_the_same_pdf_for_two_messages_is_stored_once(db):
    _, key = acme(db)
    async with api_client(db, key) as api:
        for to in ("a@example.com", "b@example.com"):
            r = await api.post("/v1/messages", json=_with(to=to))
            assert r.status_code == 201, r.text
    assert counts(db) == (2, 2, 4)


async def test_the_sender_identity_names_a_message_without_from_name(db):
    _, key = acme(db)
    async with api_client(db, key) as api:
        r = await api.post("/v1/messages", json=_with(from_name=None))
    assert r.status_code == 201, r.text
    assert r.json()["from_name"] == "Acme Billing"


async def test_admin_api_manages_sender_identities(db):
    tenant_id, key = new_tenant(db)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    base = f"/v1/admin/tenants/{tenant_id}/senders"
    async with api_client(db, admin_token=ADMIN_TOKEN) as admin, api_client(db, key) as api:
        assert (await admin.get(base)).status_code == 401  # the admin token is required
        added = await admin.post(
            base, json={"address": "News@Acme.Example", "name": "Acme News"}, headers=auth
        )
        assert added.status_code == 201, added.text
        assert added.json() == {"tenant_id": tenant_id, "added": True}
        again = await admin.post(base, json={"address": "news@acme.example"}, headers=auth)
        assert again.json()["added"] is False
        by_name = await admin.get("/v1/admin/tenants/acme/senders", headers=auth)
        assert [(s["address"], s["name"]) for s in by_name.json()] == [
            ("news@acme.example", "Acme News")
        ]
        sent = await api.post(
            "/v1/messages",
            json={"to": "a@example.com", "from": "news@acme.example", "subject": "s", "text": "t"},
        )
        assert sent.status_code == 201, sent.text
        bad = await admin.post(base, json={"address": "not an address"}, headers=auth)
        assert bad.status_code == 422 and "address" in bad.json()["errors"]
        listed = await admin.get("/v1/admin/messages", headers=auth)
        assert listed.json()["items"][0]["from_name"] == "Acme News"
        unknown = await admin.get("/v1/admin/tenants/t_nobody/senders", headers=auth)
        assert unknown.status_code == 404
        removed = await admin.delete(f"{base}/news@acme.example", headers=auth)
        assert removed.status_code == 200 and removed.json() == {"removed": True}
        gone = await admin.delete(f"{base}/news@acme.example", headers=auth)
        assert gone.status_code == 404
        refused = await api.post(
            "/v1/messages",
            json={"to": "b@example.com", "from": "news@acme.example", "subject": "s", "text": "t"},
        )
    assert refused.status_code == 422 and "from" in refused.json()["errors"]
    assert "mailbag tenants senders add" in refused.json()["errors"]["from"]
    assert counts(db)[0] == 1


async def test_the_openapi_schema_documents_every_field_with_an_example(db):
    async with api_client(db) as api:
        schema = (await api.get("/openapi.json")).json()
    create = schema["components"]["schemas"]["MessageCreate"]
    for name, field in create["properties"].items():
        assert field.get("description"), name
        assert field.get("examples"), name
    assert any("attachments" in example for example in create["examples"])
    attachment = schema["components"]["schemas"]["AttachmentIn"]
    assert all(f.get("examples") for f in attachment["properties"].values())
    out = schema["components"]["schemas"]["MessageOut"]["properties"]
    assert {"recipients", "attachments", "priority", "expires_at", "suppressed"} <= set(out)


async def test_the_python_api_takes_the_whole_model(db):
    import mailbag
    from mailbag import metrics

    add_sender(db.engine, "default", "billing@acme.example")
    before = metrics.ENQUEUED.labels("(ready-made)")._value.get()
    with db.engine.begin() as conn:
        result = mailbag.enqueue(
            conn,
            to=[mailbag.Address("ada@example.com", "Ada"), "charles@example.com"],
            bcc=["archive@example.com"],
            from_address="billing@acme.example",
            subject="Invoice",
            html="<p>Attached.</p>",
            attachments=[mailbag.Attachment("invoice.pdf", "application/pdf", PDF)],
            priority=mailbag.Priority.LOW,
            limits=mailbag.Limits(max_recipients=3),
        )
    assert result.created and result.message.template_name is None
    assert [a.filename for a in result.message.attachments] == ["invoice.pdf"]
    assert metrics.ENQUEUED.labels("(ready-made)")._value.get() == before + 1
    engine = db.async_engine()
    try:
        async with engine.begin() as conn:
            with pytest.raises(mailbag.InvalidMessage) as refused:
                await mailbag.enqueue_async(
                    conn,
                    to=["a@example.com", "b@example.com"],
                    cc=["c@example.com", "d@example.com"],
                    template="welcome",
                    data={"name": "A"},
                    limits=mailbag.Limits(max_recipients=3),
                )
    finally:
        await engine.dispose()
    assert "to" in refused.value.errors
    assert counts(db) == (1, 1, 1)


async def test_the_admin_api_shows_attachments_in_lists_and_details(db):
    _, key = acme(db)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with api_client(db, key, admin_token=ADMIN_TOKEN) as api:
        created = (await api.post("/v1/messages", json=full_body())).json()
        listed = await api.get("/v1/admin/messages", headers=auth)
        detail = await api.get(f"/v1/admin/messages/{created['id']}", headers=auth)
    assert listed.json()["items"][0]["attachments"] == created["attachments"]
    assert detail.json()["attachments"] == created["attachments"]
    assert detail.json()["recipients"]["bcc"] == [{"address": "archive@example.com"}]


async def test_what_the_provider_cannot_carry_is_refused_at_enqueue(db):
    _, key = acme(db)
    # Brevo takes one Reply-To: two are a 422 now, not a failed send later.
    async with api_client(db, key, provider="brevo", allow_test_domains=True) as api:
        r = await api.post(
            "/v1/messages", json=_with(reply_to=["a@acme.example", "b@acme.example"])
        )
    assert r.status_code == 422, r.text
    assert "reply_to" in r.json()["errors"]
    assert counts(db) == (0, 0, 0)
