"""Postmark's and Resend's event webhooks: how each is authenticated (Postmark's secret in
the URL's userinfo or a header; Resend's Svix signature, replay-safe by its timestamp),
what their records become (mailbag's events, stored once), and that reconciliation and
suppression act on them, on sqlite, postgresql and mysql. The payloads posted are checked
against the providers' schemas first (tests/data/specs)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from openapi_schema_validator import OAS31Validator
from sqlalchemy import select

from api_helpers import api_client, new_tenant
from mailbag.domain.delivery import Decision
from mailbag.domain.events import BounceType, EventKind, InvalidPayload, UnsupportedEvent
from mailbag.domain.hooks import signing
from mailbag.domain.states import Action, Status
from mailbag.providers.postmark_events import parse_postmark_webhook
from mailbag.providers.resend_events import (
    InvalidResendSignature,
    Unsigned,
    parse_resend_webhook,
    verify_resend_signature,
)
from mailbag.services import outbox as outbox_service
from mailbag.store.schema import provider_events, suppressions

from conftest import TestDB
from helpers import claim, finalize, get, message

SPECS = Path(__file__).parent / "data" / "specs"
POSTMARK_SECRET = "postmark-hook-secret"
RESEND_SECRET = signing.new_secret()
SECRETS = {"postmark_webhook_secret": POSTMARK_SECRET, "resend_webhook_secret": RESEND_SECRET}


@cache
def _spec(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((SPECS / name).read_text())
    return loaded


def conforms(payload: dict[str, Any], spec: str, schema: str) -> dict[str, Any]:
    """The payload, after checking it against the provider's schema for it."""
    root = {"$ref": f"#/components/schemas/{schema}", "components": _spec(spec)["components"]}
    OAS31Validator(root).validate(payload)
    return payload


# --- Postmark records ----------------------------------------------------------------------


def postmark(record_type: str, ours: uuid.UUID | None = None, **fields: Any) -> dict[str, Any]:
    """A Postmark webhook record as its documentation shows one."""
    metadata = {"mailbag_message_id": str(ours)} if ours else {"order": "42"}
    base: dict[str, Any] = {
        "RecordType": record_type,
        "MessageID": str(uuid.uuid4()),
        "MessageStream": "outbound",
        "Tag": "welcome",
        "Metadata": metadata,
    }
    if record_type in {"Bounce", "SpamComplaint"}:
        base |= {
            "ID": 4323372036854775807,
            "Type": "HardBounce" if record_type == "Bounce" else "SpamComplaint",
            "TypeCode": 1 if record_type == "Bounce" else 512,
            "Email": "user0@example.com",
            "BouncedAt": "2019-11-05T16:33:54.9070259Z",
            "Description": "The server was unable to deliver your message.",
            "Details": "smtp;550 5.1.1 unknown user",
            "Inactive": True,
        }
        schema = "BounceWebhook"
    elif record_type == "Delivery":
        base |= {"Recipient": "user0@example.com", "DeliveredAt": "2019-11-05T16:33:54-05:00"}
        schema = "DeliveryWebhook"
    elif record_type == "SubscriptionChange":
        base |= {
            "Recipient": "user0@example.com",
            "ChangedAt": "2020-02-01T10:53:34.416071Z",
            "Origin": "Recipient",
            "SuppressSending": True,
            "SuppressionReason": "ManualSuppression",
        }
        schema = "SubscriptionChangeWebhook"
    else:
        base |= {"Recipient": "user0@example.com", "ReceivedAt": "2019-11-05T16:33:54.1Z"}
        if record_type == "Click":
            base |= {"OriginalLink": "https://example.com/a", "ClickLocation": "HTML"}
        schema = "ClickWebhook" if record_type == "Click" else "OpenWebhook"
    return conforms({**base, **fields}, "postmark.yaml", schema)


@pytest.mark.parametrize(
    ("record", "kind", "bounce_type"),
    [
        (postmark("Delivery"), EventKind.DELIVERED, None),
        (postmark("Bounce"), EventKind.BOUNCED, BounceType.HARD),
        (postmark("Bounce", Type="SoftBounce", TypeCode=4096), EventKind.BOUNCED, BounceType.SOFT),
        (postmark("Bounce", Type="DnsError", TypeCode=256), EventKind.BOUNCED, BounceType.SOFT),
        (postmark("Bounce", Type="Transient", TypeCode=2), EventKind.DEFERRED, None),
        (postmark("Bounce", Type="BadEmailAddress", TypeCode=100000), EventKind.REJECTED, None),
        (postmark("SpamComplaint"), EventKind.COMPLAINED, None),
        (postmark("Open", FirstOpen=True), EventKind.OPENED, None),
        (postmark("Click"), EventKind.CLICKED, None),
        (postmark("SubscriptionChange"), EventKind.UNSUBSCRIBED, None),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_postmark_record_becomes_its_kind(
    record: dict[str, Any], kind: EventKind, bounce_type: BounceType | None
) -> None:
    (event,) = parse_postmark_webhook(record)

    assert (event.provider, event.kind, event.bounce_type) == ("postmark", kind, bounce_type)
    assert event.provider_message_id == record["MessageID"]
    assert event.recipient == "user0@example.com"
    assert event.message_id is None  # Postmark's MessageID is its own UUID, never ours
    assert event.occurred_at.tzinfo is not None


def test_a_postmark_record_names_our_message_by_its_metadata_and_its_time_in_utc() -> None:
    ours = uuid.uuid4()
    (event,) = parse_postmark_webhook(
        postmark("Bounce", ours, BouncedAt="2014-08-01T13:28:10.2735393-04:00")
    )

    assert event.message_id == ours
    assert event.occurred_at == datetime(2014, 8, 1, 17, 28, 10, 273539, tzinfo=UTC)
    assert event.detail is not None and "550 5.1.1" in event.detail
    (click,) = parse_postmark_webhook(postmark("Click"))
    assert click.detail == "https://example.com/a"


@pytest.mark.parametrize(
    "record",
    [
        postmark("Bounce", Type="AutoResponder", TypeCode=64),
        postmark("SubscriptionChange", SuppressSending=False, SuppressionReason=None),
        postmark("SubscriptionChange", SuppressionReason="HardBounce"),  # the Bounce said it
    ],
)
def test_postmark_records_that_are_no_verdict_give_no_event(record: dict[str, Any]) -> None:
    assert parse_postmark_webhook(record) == []


def test_unknown_or_malformed_postmark_bodies_are_refused() -> None:
    with pytest.raises(UnsupportedEvent, match="Wobble"):
        parse_postmark_webhook({**postmark("Delivery"), "RecordType": "Wobble"})
    with pytest.raises(UnsupportedEvent, match="Bounce/Sideways"):
        parse_postmark_webhook({**postmark("Bounce"), "Type": "Sideways"})
    for body in ([], {"FromFull": {}}, {"RecordType": "Delivery", "MessageID": "x"}):
        with pytest.raises(InvalidPayload):
            parse_postmark_webhook(body)
    with pytest.raises(InvalidPayload, match="time zone"):
        parse_postmark_webhook(postmark("Delivery", DeliveredAt="2019-11-05T16:33:54"))


def test_postmark_dedup_keys_tell_records_apart_and_repeat_for_a_resend() -> None:
    record = postmark("Open")
    again = parse_postmark_webhook(json.loads(json.dumps(record)))[0].dedup_key
    later = parse_postmark_webhook({**record, "ReceivedAt": "2019-11-05T16:40:00Z"})[0]

    assert parse_postmark_webhook(record)[0].dedup_key == again
    assert later.dedup_key != again


# --- Resend events and signatures ----------------------------------------------------------


def resend(kind: str, ours: uuid.UUID | None = None, **data: Any) -> dict[str, Any]:
    """A Resend webhook event as its spec describes one."""
    payload: dict[str, Any] = {
        "type": kind,
        "created_at": "2026-01-01T12:00:05.678Z",
        "data": {
            "email_id": str(uuid.uuid4()),
            "created_at": "2026-01-01T12:00:00.000Z",
            "from": "Sender <sender@example.com>",
            "to": ["User 0 <user0@example.com>"],
            "subject": "Hello 0",
            "tags": {"test": "true", **({"mailbag_message_id": str(ours)} if ours else {})},
            **data,
        },
    }
    schemas = {
        "email.sent": "EmailSentEvent",
        "email.delivered": "EmailDeliveredEvent",
        "email.delivery_delayed": "EmailDeliveryDelayedEvent",
        "email.bounced": "EmailBouncedEvent",
        "email.complained": "EmailComplainedEvent",
        "email.opened": "EmailOpenedEvent",
        "email.clicked": "EmailClickedEvent",
        "email.failed": "EmailFailedEvent",
        "email.suppressed": "EmailSuppressedEvent",
    }
    return conforms(payload, "resend.yaml", schemas[kind]) if kind in schemas else payload


def bounce(kind: str) -> dict[str, Any]:
    return {
        "bounce": {
            "type": kind,
            "subType": "General",
            "message": "The recipient's email provider sent a hard bounce message.",
            "diagnosticCode": ["smtp; 550 5.1.1 user unknown"],
        }
    }


CLICK = {
    "click": {
        "ipAddress": "192.0.2.1",
        "link": "https://example.com/a",
        "timestamp": "2026-01-01T12:01:00.000Z",
        "userAgent": "Mozilla/5.0",
    }
}


@pytest.mark.parametrize(
    ("event", "kind", "bounce_type"),
    [
        (resend("email.sent"), EventKind.ACCEPTED, None),
        (resend("email.delivered"), EventKind.DELIVERED, None),
        (resend("email.delivery_delayed"), EventKind.DEFERRED, None),
        (resend("email.bounced", **bounce("Permanent")), EventKind.BOUNCED, BounceType.HARD),
        (resend("email.bounced", **bounce("Transient")), EventKind.BOUNCED, BounceType.SOFT),
        (resend("email.bounced", **bounce("Undetermined")), EventKind.BOUNCED, BounceType.SOFT),
        (resend("email.complained"), EventKind.COMPLAINED, None),
        (resend("email.opened"), EventKind.OPENED, None),
        (resend("email.clicked", **CLICK), EventKind.CLICKED, None),
        (
            resend("email.failed", failed={"reason": "reached_daily_quota"}),
            EventKind.REJECTED,
            None,
        ),
    ],
)
def test_each_resend_event_becomes_its_kind(
    event: dict[str, Any], kind: EventKind, bounce_type: BounceType | None
) -> None:
    (parsed,) = parse_resend_webhook(event, "msg_1")

    assert (parsed.provider, parsed.kind, parsed.bounce_type) == ("resend", kind, bounce_type)
    assert parsed.provider_message_id == event["data"]["email_id"]
    assert parsed.recipient == "user0@example.com"
    assert parsed.message_id is None  # Resend's email_id is its own UUID, never ours


def test_a_resend_event_names_our_message_by_tag_or_header_and_each_recipient() -> None:
    ours = uuid.uuid4()
    (by_tag,) = parse_resend_webhook(resend("email.delivered", ours), "msg_1")
    by_header = parse_resend_webhook(
        resend(
            "email.delivered",
            headers=[{"name": "x-mailbag-message-id", "value": str(ours)}],
            to=["a@example.com", "b@example.com"],
        ),
        "msg_2",
    )

    assert by_tag.message_id == ours
    assert [e.message_id for e in by_header] == [ours, ours]
    assert [e.recipient for e in by_header] == ["a@example.com", "b@example.com"]
    assert len({e.dedup_key for e in by_header}) == 2
    (click,) = parse_resend_webhook(resend("email.clicked", **CLICK), "msg_3")
    assert click.detail == "https://example.com/a"


def test_resend_types_mailbag_does_not_keep_give_no_event_and_unknown_ones_are_named() -> None:
    for kind in ("email.scheduled", "email.received", "contact.created", "domain.updated"):
        assert parse_resend_webhook(resend(kind), "msg_1") == []
    with pytest.raises(UnsupportedEvent, match=r"email\.teleported"):
        parse_resend_webhook(resend("email.teleported"), "msg_1")
    for body in ([], {"type": "email.delivered"}, {"data": {}}):
        with pytest.raises(InvalidPayload):
            parse_resend_webhook(body, "msg_1")


def svix_headers(
    body: bytes, *, secret: str = RESEND_SECRET, at: float | None = None
) -> dict[str, str]:
    """The headers Svix sends: the Standard Webhooks ones under svix-* names."""
    stamp = int(time.time() if at is None else at)
    msg_id = f"msg_{uuid.uuid4().hex}"
    standard = signing.signed_headers(signing.parse_secret(secret), msg_id, stamp, body)
    return {name.replace("webhook-", "svix-"): value for name, value in standard.items()}


def test_a_svix_signature_verifies_and_a_wrong_stale_or_missing_one_does_not() -> None:
    body = json.dumps(resend("email.delivered")).encode()
    now = time.time()
    headers = svix_headers(body, at=now)

    assert verify_resend_signature(RESEND_SECRET, headers, body, now=now) == headers["svix-id"]
    with pytest.raises(InvalidResendSignature, match="no signature matches"):
        verify_resend_signature(
            RESEND_SECRET, svix_headers(body, secret=signing.new_secret()), body, now=now
        )
    with pytest.raises(InvalidResendSignature, match="no signature matches"):
        verify_resend_signature(RESEND_SECRET, headers, body + b" ", now=now)
    with pytest.raises(InvalidResendSignature, match="tolerance"):
        verify_resend_signature(RESEND_SECRET, headers, body, now=now + 6 * 60)
    with pytest.raises(Unsigned):
        verify_resend_signature(RESEND_SECRET, {}, body, now=now)


# --- through the HTTP API, on every database -------------------------------------------------


def unknown_message(db: TestDB, **fields: Any) -> Any:
    """A message whose send ended ambiguously (what a lost connection after the request
    leaves): it waits in `unknown` for evidence."""
    with db.engine.begin() as conn:
        (result,) = outbox_service.write_many(conn, [message(0, **fields)])
    batch = claim(db, now=datetime.now(UTC))
    finalize(
        db,
        batch.token,
        (result.message.id, Decision(Action.MARK_UNKNOWN, error="read timeout")),
        now=datetime.now(UTC),
    )
    return get(db, result.message.id)


def stored(db: TestDB) -> list[Any]:
    with db.engine.connect() as conn:
        return list(conn.execute(select(provider_events).order_by(provider_events.c.id)).all())


def suppressed(db: TestDB) -> list[str]:
    with db.engine.connect() as conn:
        return [row.email for row in conn.execute(select(suppressions)).all()]


async def test_postmark_records_authenticated_in_the_url_or_a_header_are_stored_once(db):
    msg = unknown_message(db)
    record = postmark("Delivery", msg.id)
    async with api_client(db, **SECRETS) as api:
        first = await api.post(
            "/v1/webhooks/postmark", json=record, auth=("postmark", POSTMARK_SECRET)
        )
        again = await api.post(
            "/v1/webhooks/postmark",
            json=record,
            headers={"X-Mailbag-Webhook-Secret": POSTMARK_SECRET},
        )
    assert first.status_code == 200 and first.json()["stored"] == 1
    assert first.json()["resolved"] == 1  # a delivery settles the unknown send
    assert again.status_code == 200 and again.json()["duplicates"] == 1
    assert get(db, msg.id).status == Status.SENT
    (row,) = stored(db)
    assert (row.provider, row.kind, row.message_id) == ("postmark", "delivered", msg.id)


async def test_postmark_records_without_the_secret_are_refused_and_nothing_is_stored(db):
    record = postmark("Delivery")
    async with api_client(db, **SECRETS) as api:
        missing = await api.post("/v1/webhooks/postmark", json=record)
        wrong = await api.post("/v1/webhooks/postmark", json=record, auth=("postmark", "wrong"))
    async with api_client(db) as api:  # no secret configured: the endpoint is off
        off = await api.post(
            "/v1/webhooks/postmark", json=record, auth=("postmark", POSTMARK_SECRET)
        )
    assert (missing.status_code, wrong.status_code, off.status_code) == (401, 401, 404)
    assert stored(db) == []


async def test_a_postmark_hard_bounce_suppresses_and_a_soft_one_does_not(db):
    tenant_id, _ = new_tenant(db)
    msg = unknown_message(db, to="user0@example.com", tenant_id=tenant_id)
    auth = ("postmark", POSTMARK_SECRET)
    async with api_client(db, **SECRETS) as api:
        soft = await api.post(
            "/v1/webhooks/postmark",
            json=postmark("Bounce", msg.id, Type="SoftBounce", TypeCode=4096),
            auth=auth,
        )
        assert soft.json()["suppressed"] == 0 and suppressed(db) == []
        hard = await api.post("/v1/webhooks/postmark", json=postmark("Bounce", msg.id), auth=auth)
    assert hard.json()["suppressed"] == 1
    assert suppressed(db) == ["user0@example.com"]


async def test_postmark_records_mailbag_does_not_keep_are_answered_and_not_stored(db):
    auth = ("postmark", POSTMARK_SECRET)
    async with api_client(db, **SECRETS) as api:
        auto = await api.post(
            "/v1/webhooks/postmark",
            json=postmark("Bounce", Type="AutoResponder", TypeCode=64),
            auth=auth,
        )
        unknown = await api.post(
            "/v1/webhooks/postmark",
            json={**postmark("Delivery"), "RecordType": "Wobble"},
            auth=auth,
        )
        bad = await api.post("/v1/webhooks/postmark", content=b"{not json", auth=auth)
    assert auto.status_code == 200 and auto.json()["ignored"] == 1
    assert unknown.status_code == 200 and unknown.json()["ignored"] == 1
    assert bad.status_code == 400
    assert stored(db) == []


async def post_resend(api: Any, payload: dict[str, Any], **signature: Any) -> Any:
    body = json.dumps(payload).encode()
    headers = {"content-type": "application/json", **svix_headers(body, **signature)}
    return await api.post("/v1/webhooks/resend", content=body, headers=headers)


async def test_signed_resend_events_are_stored_once_and_settle_an_unknown_send(db):
    msg = unknown_message(db)
    payload = resend("email.delivered", msg.id)
    body = json.dumps(payload).encode()
    headers = {"content-type": "application/json", **svix_headers(body)}
    async with api_client(db, **SECRETS) as api:
        first = await api.post("/v1/webhooks/resend", content=body, headers=headers)
        again = await api.post("/v1/webhooks/resend", content=body, headers=headers)  # Svix resends
    assert first.status_code == 200, first.text
    assert first.json()["stored"] == 1 and first.json()["resolved"] == 1
    assert again.json()["duplicates"] == 1
    assert get(db, msg.id).status == Status.SENT
    (row,) = stored(db)
    assert (row.provider, row.kind, row.message_id) == ("resend", "delivered", msg.id)


async def test_wrongly_signed_unsigned_or_replayed_resend_events_are_refused(db):
    payload = resend("email.delivered")
    body = json.dumps(payload).encode()
    async with api_client(db, **SECRETS) as api:
        wrong = await post_resend(api, payload, secret=signing.new_secret())
        stale = await post_resend(api, payload, at=time.time() - 10 * 60)
        unsigned = await api.post("/v1/webhooks/resend", content=body)
        tampered = await api.post(
            "/v1/webhooks/resend",
            content=body.replace(b"delivered", b"bounced"),
            headers=svix_headers(body),
        )
    async with api_client(db) as api:  # no secret configured: the endpoint is off
        off = await post_resend(api, payload)
    assert (wrong.status_code, stale.status_code, tampered.status_code) == (403, 403, 403)
    assert unsigned.status_code == 401 and off.status_code == 404
    assert "tolerance" in stale.json()["detail"]
    assert stored(db) == []


async def test_resend_bounces_and_complaints_suppress_and_a_failure_settles_as_failed(db):
    tenant_id, _ = new_tenant(db)
    bounced = unknown_message(db, to="user0@example.com", tenant_id=tenant_id)
    async with api_client(db, **SECRETS) as api:
        transient = await post_resend(
            api, resend("email.bounced", bounced.id, **bounce("Transient"))
        )
        assert transient.json()["suppressed"] == 0
        hard = await post_resend(api, resend("email.bounced", bounced.id, **bounce("Permanent")))
    assert hard.json()["suppressed"] == 1 and suppressed(db) == ["user0@example.com"]
    assert get(db, bounced.id).status == Status.SENT  # a bounce proves Resend had it

    failed = unknown_message(db, to="user1@example.com")
    async with api_client(db, **SECRETS) as api:
        r = await post_resend(
            api, resend("email.failed", failed.id, failed={"reason": "reached_daily_quota"})
        )
    assert r.json()["resolved"] == 1
    assert get(db, failed.id).status == Status.FAILED


async def test_resend_types_mailbag_does_not_keep_are_answered_and_not_stored(db):
    async with api_client(db, **SECRETS) as api:
        scheduled = await post_resend(api, resend("email.scheduled"))
        contact = await post_resend(api, resend("contact.created"))
        unknown = await post_resend(api, resend("email.teleported"))
    assert all(
        r.status_code == 200 and r.json()["ignored"] == 1 for r in (scheduled, contact, unknown)
    )
    assert stored(db) == []
