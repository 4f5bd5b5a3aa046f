"""SendGrid's and Mailgun's event webhooks: their signatures (SendGrid's ECDSA Signed Event
Webhook, checked against SendGrid's own test vector; Mailgun's HMAC of a timestamp and a
single-use token), replay safety, what their events become (mailbag's events, stored
once), and that reconciliation and suppression act on them, on sqlite, postgresql and
mysql. Mailgun's `event-data` is checked against its spec's EventResponse schema first."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from openapi_schema_validator import OAS31Validator
from sqlalchemy import select

from api_helpers import api_client, new_tenant
from mailbag.domain.delivery import Decision
from mailbag.domain.events import BounceType, EventKind, InvalidPayload, UnsupportedEvent
from mailbag.domain.states import Action, Status
from mailbag.providers.mailgun import MailgunProvider
from mailbag.providers.mailgun_events import authenticate as mailgun_authenticate
from mailbag.providers.mailgun_events import parse_mailgun_event
from mailbag.providers.sendgrid_events import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    authenticate,
    load_public_key,
    parse_sendgrid_events,
    verify_signature,
)
from mailbag.providers.signed_webhooks import InvalidSignature, StaleMessage, Unsigned
from mailbag.services import outbox as outbox_service
from mailbag.services.reconciliation import Reconciler
from mailbag.store.schema import provider_events, suppressions
from mailgun_server import MailgunServer

from conftest import TestDB
from helpers import claim, finalize, get, message, outgoing_email

SPECS = Path(__file__).parent / "data" / "specs"
K, B = EventKind, BounceType

# SendGrid's signing key for these tests (SendGrid keeps its private key; we play SendGrid).
SENDGRID_KEY = ec.generate_private_key(ec.SECP256R1())
SENDGRID_PUBLIC = base64.b64encode(
    SENDGRID_KEY.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
).decode()  # as SendGrid's settings page shows it
MAILGUN_SIGNING_KEY = "mailgun-signing-key-" + secrets.token_hex(8)
SETTINGS = {
    "sendgrid_webhook_public_key": SENDGRID_PUBLIC,
    "mailgun_webhook_signing_key": MAILGUN_SIGNING_KEY,
}

# SendGrid's own test vector (sendgrid/sendgrid-python test/unit/test_eventwebhook.py, MIT).
VECTOR_KEY = (
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw"
    "+2fNNRaINXvVpiglSI8eNEc6wEA3F+g=="
)
VECTOR_SIGNATURE = (
    "MEUCIGHQVtGj+Y3LkG9fLcxf3qfI10QysgDWmMOVmxG0u6ZUAiEAyBiXDWzM+uOe5W0JuG+luQAbPIqHh89M15"
    "TluLtEZtM="
)
VECTOR_TIMESTAMP = "1600112502"
VECTOR_PAYLOAD = (
    json.dumps(
        [
            {
                "email": "hello@world.com",
                "event": "dropped",
                "reason": "Bounced Address",
                "sg_event_id": "ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA",
                "sg_message_id": (
                    "LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-756b745b58-kmzbl-18-5F5FC76C-9.0"
                ),
                "smtp-id": "<LRzXl_NHStOGhQ4kofSm_A@ismtpd0039p1iad1.sendgrid.net>",
                "timestamp": 1600112492,
            }
        ],
        sort_keys=True,
        separators=(",", ":"),
    )
    + "\r\n"
)


# --- SendGrid: the signature ------------------------------------------------------------------


def test_sendgrids_own_test_vector_verifies_and_any_change_to_it_does_not() -> None:
    key = load_public_key(VECTOR_KEY)
    body = VECTOR_PAYLOAD.encode()

    verify_signature(key, VECTOR_SIGNATURE, VECTOR_TIMESTAMP, body)  # no exception
    for signature, timestamp, changed in (
        (VECTOR_SIGNATURE, VECTOR_TIMESTAMP, body.replace(b"dropped", b"delivered")),
        (VECTOR_SIGNATURE, "1600112503", body),
        (VECTOR_SIGNATURE[:-8] + "AAAAAAA=", VECTOR_TIMESTAMP, body),
        ("not base64!", VECTOR_TIMESTAMP, body),
    ):
        with pytest.raises(InvalidSignature):
            verify_signature(key, signature, timestamp, changed)


def test_the_public_key_is_read_as_base64_der_or_pem_and_nothing_else() -> None:
    pem = SENDGRID_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert (
        load_public_key(SENDGRID_PUBLIC).public_numbers()
        == SENDGRID_KEY.public_key().public_numbers()
    )
    assert (
        load_public_key(pem.decode()).public_numbers() == SENDGRID_KEY.public_key().public_numbers()
    )
    other_curve = base64.b64encode(
        ec.generate_private_key(ec.SECP384R1())
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    ).decode()
    rsa_pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    for wrong in ("not a key", "QUJD", other_curve, rsa_pem):
        with pytest.raises(ValueError, match="not a"):
            load_public_key(wrong)


def sendgrid_headers(body: bytes, *, at: float | None = None, key: Any = None) -> dict[str, str]:
    """The headers SendGrid's Signed Event Webhook sends with `body`."""
    stamp = str(int(time.time() if at is None else at))
    signer = key or SENDGRID_KEY
    signature = signer.sign(stamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    return {
        SIGNATURE_HEADER: base64.b64encode(signature).decode(),
        TIMESTAMP_HEADER: stamp,
        "content-type": "application/json",
    }


def test_a_sendgrid_request_must_be_signed_over_its_body_within_the_replay_window() -> None:
    key = load_public_key(SENDGRID_PUBLIC)
    body = b'[{"event": "delivered"}]'
    now = datetime.now(UTC)

    authenticate(key, sendgrid_headers(body, at=now.timestamp()), body, now)  # no exception
    with pytest.raises(Unsigned):
        authenticate(key, {}, body, now)
    with pytest.raises(StaleMessage):
        authenticate(key, sendgrid_headers(body, at=now.timestamp() - 6 * 60), body, now)
    with pytest.raises(StaleMessage):
        authenticate(key, sendgrid_headers(body, at=now.timestamp() + 6 * 60), body, now)
    with pytest.raises(InvalidSignature):
        authenticate(key, sendgrid_headers(body + b" "), body, now)


# --- SendGrid: the events ---------------------------------------------------------------------

X_MESSAGE_ID = "LRzXl_NHStOGhQ4kofSm_A"


def sendgrid_event(name: str, ours: uuid.UUID | None = None, **fields: Any) -> dict[str, Any]:
    """One event as SendGrid's Event Webhook reference shows it, our custom_args at the top."""
    event: dict[str, Any] = {
        "email": "user0@example.com",
        "timestamp": 1_764_460_000,
        "smtp-id": f"<{X_MESSAGE_ID}@ismtpd0001p1las1.sendgrid.net>",
        "event": name,
        "category": ["welcome"],
        "sg_event_id": base64.urlsafe_b64encode(secrets.token_bytes(24)).decode(),
        "sg_message_id": f"{X_MESSAGE_ID}.filterdrecv-p3las1-5bf99c48d-wjfjn-18-5F5FC76C-9.0",
        "mailbag_tenant_id": "default",
        **({"mailbag_message_id": str(ours)} if ours else {}),
    }
    return {**event, **fields}


@pytest.mark.parametrize(
    ("event", "kind", "bounce_type"),
    [
        (sendgrid_event("processed"), K.ACCEPTED, None),
        (sendgrid_event("deferred", response="400 try again later", attempt="5"), K.DEFERRED, None),
        (sendgrid_event("delivered", response="250 OK"), K.DELIVERED, None),
        (
            sendgrid_event("bounce", type="bounce", reason="550 5.1.1 no such user"),
            K.BOUNCED,
            B.HARD,
        ),
        (sendgrid_event("bounce", type="blocked", reason="550 5.7.1 IP listed"), K.BOUNCED, B.SOFT),
        (sendgrid_event("bounce", reason="550 unknown user"), K.BOUNCED, B.HARD),  # no type: old
        (sendgrid_event("dropped", reason="Bounced Address"), K.REJECTED, None),
        (sendgrid_event("spamreport"), K.COMPLAINED, None),
        (sendgrid_event("open", useragent="Mozilla/5.0"), K.OPENED, None),
        (sendgrid_event("click", url="https://example.com/a"), K.CLICKED, None),
        (sendgrid_event("unsubscribe"), K.UNSUBSCRIBED, None),
        (sendgrid_event("group_unsubscribe", asm_group_id=1), K.UNSUBSCRIBED, None),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_sendgrid_event_becomes_its_kind(
    event: dict[str, Any], kind: EventKind, bounce_type: BounceType | None
) -> None:
    (parsed,), problems = parse_sendgrid_events([event])

    assert problems == []
    assert (parsed.provider, parsed.kind, parsed.bounce_type) == ("sendgrid", kind, bounce_type)
    assert parsed.provider_message_id == X_MESSAGE_ID  # what the send's X-Message-Id said
    assert parsed.recipient == "user0@example.com"
    assert parsed.occurred_at == datetime.fromtimestamp(1_764_460_000, tz=UTC)
    assert parsed.message_id is None  # without our custom_args, SendGrid's smtp-id is not ours


def test_a_sendgrid_event_names_our_message_by_custom_args_and_its_details() -> None:
    ours = uuid.uuid4()
    events, _ = parse_sendgrid_events(
        [
            sendgrid_event("bounce", ours, type="bounce", reason="550 5.1.1 no such user"),
            sendgrid_event("click", url="https://example.com/a", **{"smtp-id": f"<{ours}@x.io>"}),
        ]
    )

    assert [e.message_id for e in events] == [ours, ours]  # custom_args, then our Message-ID
    assert [e.detail for e in events] == ["550 5.1.1 no such user", "https://example.com/a"]


def test_sendgrid_events_are_deduplicated_by_sg_event_id() -> None:
    event = sendgrid_event("delivered")
    resent, _ = parse_sendgrid_events([json.loads(json.dumps(event)), {**event, "timestamp": 1}])
    other, _ = parse_sendgrid_events([{**event, "sg_event_id": "other"}])
    no_id, _ = parse_sendgrid_events([{k: v for k, v in event.items() if k != "sg_event_id"}])

    assert (
        resent[0].dedup_key == resent[1].dedup_key == parse_sendgrid_events([event])[0][0].dedup_key
    )
    assert other[0].dedup_key != resent[0].dedup_key
    assert no_id[0].dedup_key not in {resent[0].dedup_key, other[0].dedup_key}


def test_a_sendgrid_batch_keeps_its_good_events_and_says_why_others_are_skipped() -> None:
    good = sendgrid_event("delivered")
    events, problems = parse_sendgrid_events(
        [good, sendgrid_event("group_resubscribe"), {"event": "open"}, "x", {"timestamp": 1}]
    )

    assert [e.kind for e in events] == [K.DELIVERED]
    assert [type(p) for p in problems] == [
        UnsupportedEvent,
        InvalidPayload,
        InvalidPayload,
        InvalidPayload,
    ]
    for body in ({"event": "delivered"}, "[]", None):
        with pytest.raises(InvalidPayload):
            parse_sendgrid_events(body)


# --- Mailgun: the signature and the events -----------------------------------------------------


@cache
def _mailgun_components() -> dict[str, Any]:
    components: dict[str, Any] = yaml.safe_load((SPECS / "mailgun.yaml").read_text())["components"]
    return components


def conforms_to_mailgun(event_data: dict[str, Any]) -> dict[str, Any]:
    """The event, after checking it against the spec's EventResponse (an Events API record,
    the shape a webhook's event-data has too)."""
    root = {"$ref": "#/components/schemas/EventResponse", "components": _mailgun_components()}
    OAS31Validator(root).validate(event_data)
    return event_data


def mailgun_event(name: str, ours: uuid.UUID | None = None, **fields: Any) -> dict[str, Any]:
    """A Mailgun `event-data` as its webhook and Events API documentation show it."""
    data: dict[str, Any] = {
        "event": name,
        "id": secrets.token_urlsafe(16),
        "timestamp": 1_764_460_000.25,
        "log-level": "info",
        "recipient": "user0@example.com",
        "message": {
            "headers": {
                "to": "user0@example.com",
                "message-id": f"{ours or 'abc.1.XYZ'}@mg.example.com",
                "from": "sender@example.com",
                "subject": "Hello 0",
            },
            "attachments": [],
            "size": 586,
        },
        "tags": ["welcome"],
        "user-variables": {"mailbag-message-id": str(ours)} if ours else {},
    }
    return conforms_to_mailgun({**data, **fields})


def signed_mailgun(
    event_data: dict[str, Any],
    *,
    key: str = MAILGUN_SIGNING_KEY,
    at: float | None = None,
    token: str | None = None,
) -> dict[str, Any]:
    """A webhook body as Mailgun posts it: the signature block and the event."""
    stamp = str(int(time.time() if at is None else at))
    token = token or secrets.token_hex(25)
    signature = hmac.new(key.encode(), (stamp + token).encode(), hashlib.sha256).hexdigest()
    return {
        "signature": {"timestamp": stamp, "token": token, "signature": signature},
        "event-data": event_data,
    }


def test_a_mailgun_signature_is_checked_in_constant_time_within_the_replay_window() -> None:
    now = datetime.now(UTC)
    body = signed_mailgun(mailgun_event("delivered"), at=now.timestamp())

    assert mailgun_authenticate(MAILGUN_SIGNING_KEY, body, now) == body["signature"]["token"]
    with pytest.raises(InvalidSignature, match="does not match"):
        mailgun_authenticate("another-key", body, now)
    with pytest.raises(StaleMessage):
        mailgun_authenticate(MAILGUN_SIGNING_KEY, body, now + timedelta(minutes=6))
    for unsigned in ({"event-data": {}}, [], {"signature": {"timestamp": "1", "token": ""}}):
        with pytest.raises(Unsigned):
            mailgun_authenticate(MAILGUN_SIGNING_KEY, unsigned, now)


@pytest.mark.parametrize(
    ("data", "kind", "bounce_type"),
    [
        (mailgun_event("accepted"), K.ACCEPTED, None),
        (mailgun_event("delivered"), K.DELIVERED, None),
        (mailgun_event("failed", severity="temporary", reason="generic"), K.BOUNCED, B.SOFT),
        (mailgun_event("failed", severity="permanent", reason="bounce"), K.BOUNCED, B.HARD),
        (mailgun_event("failed", severity="permanent", reason="old"), K.BOUNCED, B.SOFT),
        (mailgun_event("failed", severity="permanent", reason="suppress-bounce"), K.REJECTED, None),
        (mailgun_event("rejected", reject={"reason": "Sandbox subdomains"}), K.REJECTED, None),
        (mailgun_event("complained"), K.COMPLAINED, None),
        (mailgun_event("opened"), K.OPENED, None),
        (mailgun_event("clicked", url="https://example.com/a"), K.CLICKED, None),
        (mailgun_event("unsubscribed"), K.UNSUBSCRIBED, None),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_mailgun_event_becomes_its_kind(
    data: dict[str, Any], kind: EventKind, bounce_type: BounceType | None
) -> None:
    event = parse_mailgun_event({"event-data": data}, "token-1")

    assert (event.provider, event.kind, event.bounce_type) == ("mailgun", kind, bounce_type)
    assert event.provider_message_id == "<abc.1.XYZ@mg.example.com>"  # as the send returned it
    assert event.recipient == "user0@example.com" and event.message_id is None
    assert event.occurred_at == datetime.fromtimestamp(1_764_460_000.25, tz=UTC)
    assert "signature" not in event.raw


def test_a_mailgun_event_names_our_message_by_its_variable_or_our_message_id() -> None:
    ours = uuid.uuid4()
    by_variable = parse_mailgun_event({"event-data": mailgun_event("delivered", ours)}, "t1")
    by_header = parse_mailgun_event(
        {"event-data": mailgun_event("delivered", ours, **{"user-variables": {}})}, "t2"
    )
    failed = parse_mailgun_event(
        {
            "event-data": mailgun_event(
                "failed",
                ours,
                severity="permanent",
                reason="bounce",
                **{"delivery-status": {"code": 550, "description": "", "message": "5.1.1 no user"}},
            )
        },
        "t3",
    )
    assert by_variable.message_id == by_header.message_id == failed.message_id == ours
    assert failed.detail == "5.1.1 no user"


def test_a_mailgun_event_is_deduplicated_by_its_token_whatever_it_carries() -> None:
    first = parse_mailgun_event({"event-data": mailgun_event("delivered")}, "the-token")
    forged = parse_mailgun_event(
        {"event-data": mailgun_event("failed", severity="permanent", recipient="x@example.com")},
        "the-token",
    )
    other = parse_mailgun_event({"event-data": mailgun_event("delivered")}, "another-token")

    assert first.dedup_key == forged.dedup_key != other.dedup_key


def test_unknown_or_malformed_mailgun_events_are_refused() -> None:
    with pytest.raises(UnsupportedEvent, match="stored"):
        parse_mailgun_event({"event-data": mailgun_event("stored")}, "t")
    for body in ({}, {"event-data": {"event": "delivered"}}, {"event-data": {"timestamp": 1}}):
        with pytest.raises(InvalidPayload):
            parse_mailgun_event(body, "t")


# --- through the HTTP API, on every database ---------------------------------------------------


def unknown_message(db: TestDB, **fields: Any) -> Any:
    """A message whose send ended ambiguously: it waits in `unknown` for evidence."""
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


async def post_sendgrid(api: Any, events: list[dict[str, Any]], **signing: Any) -> Any:
    body = json.dumps(events).encode()
    return await api.post(
        "/v1/webhooks/sendgrid", content=body, headers=sendgrid_headers(body, **signing)
    )


async def test_signed_sendgrid_events_are_stored_once_and_settle_an_unknown_send(db):
    msg = unknown_message(db)
    body = json.dumps(
        [sendgrid_event("delivered", msg.id), sendgrid_event("open", msg.id)]
    ).encode()
    headers = sendgrid_headers(body)
    async with api_client(db, **SETTINGS) as api:
        first = await api.post("/v1/webhooks/sendgrid", content=body, headers=headers)
        again = await api.post("/v1/webhooks/sendgrid", content=body, headers=headers)  # a resend
    assert first.status_code == 200, first.text
    assert first.json()["stored"] == 2 and first.json()["resolved"] == 1
    assert again.json()["duplicates"] == 2 and again.json()["stored"] == 0
    assert get(db, msg.id).status == Status.SENT
    rows = stored(db)
    assert [(r.provider, r.kind, r.message_id) for r in rows] == [
        ("sendgrid", "delivered", msg.id),
        ("sendgrid", "opened", msg.id),
    ]


async def test_wrongly_signed_unsigned_stale_or_tampered_sendgrid_batches_are_refused(db):
    events = [sendgrid_event("delivered")]
    body = json.dumps(events).encode()
    async with api_client(db, **SETTINGS) as api:
        wrong = await post_sendgrid(api, events, key=ec.generate_private_key(ec.SECP256R1()))
        stale = await post_sendgrid(api, events, at=time.time() - 10 * 60)
        unsigned = await api.post("/v1/webhooks/sendgrid", content=body)
        tampered = await api.post(
            "/v1/webhooks/sendgrid",
            content=body.replace(b"delivered", b"bounce"),
            headers=sendgrid_headers(body),
        )
    async with api_client(db) as api:  # no key configured: the endpoint is off
        off = await post_sendgrid(api, events)
    async with api_client(db, sendgrid_webhook_public_key="not a key") as api:
        misconfigured = await post_sendgrid(api, events)
    assert (wrong.status_code, stale.status_code, tampered.status_code) == (403, 403, 403)
    assert stale.json()["type"].endswith("/stale-message")
    assert unsigned.status_code == 401 and "www-authenticate" in unsigned.headers
    assert off.status_code == 404
    assert misconfigured.status_code == 503 and "not a key" not in misconfigured.text
    assert stored(db) == []


async def test_a_sendgrid_hard_bounce_suppresses_a_blocked_one_does_not_and_a_drop_fails(db):
    tenant_id, _ = new_tenant(db)
    bounced = unknown_message(db, to="user0@example.com", tenant_id=tenant_id)
    async with api_client(db, **SETTINGS) as api:
        blocked = await post_sendgrid(api, [sendgrid_event("bounce", bounced.id, type="blocked")])
        assert blocked.json()["suppressed"] == 0 and suppressed(db) == []
        hard = await post_sendgrid(api, [sendgrid_event("bounce", bounced.id, type="bounce")])
    assert hard.json()["suppressed"] == 1
    assert suppressed(db) == ["user0@example.com"]
    assert get(db, bounced.id).status == Status.SENT  # a bounce proves SendGrid had it

    dropped = unknown_message(db, to="user1@example.com")
    async with api_client(db, **SETTINGS) as api:
        r = await post_sendgrid(
            api, [sendgrid_event("dropped", dropped.id, email="user1@example.com")]
        )
    assert r.json()["resolved"] == 1
    assert get(db, dropped.id).status == Status.FAILED


async def test_sendgrid_event_types_mailbag_does_not_keep_are_ignored_and_bad_ones_skipped(db):
    async with api_client(db, **SETTINGS) as api:
        mixed = await post_sendgrid(
            api,
            [sendgrid_event("delivered"), sendgrid_event("group_resubscribe"), {"event": "open"}],
        )
        only_unknown = await post_sendgrid(api, [sendgrid_event("group_resubscribe")])
        only_bad = await post_sendgrid(api, [{"event": "open"}])
        not_a_list = await post_sendgrid(api, {"event": "open"})  # type: ignore[arg-type]
    assert mixed.status_code == 200
    assert (mixed.json()["stored"], mixed.json()["ignored"], mixed.json()["skipped"]) == (1, 1, 1)
    assert only_unknown.status_code == 200 and only_unknown.json()["ignored"] == 1
    assert only_bad.status_code == 400 and not_a_list.status_code == 400
    assert len(stored(db)) == 1


async def post_mailgun(api: Any, body: Any) -> Any:
    return await api.post("/v1/webhooks/mailgun", json=body)


async def test_a_signed_mailgun_event_is_stored_once_and_settles_an_unknown_send(db):
    msg = unknown_message(db)
    body = signed_mailgun(mailgun_event("delivered", msg.id))
    async with api_client(db, **SETTINGS) as api:
        first = await post_mailgun(api, body)
        again = await post_mailgun(api, body)  # Mailgun's retry: the same request
    assert first.status_code == 200, first.text
    assert first.json()["stored"] == 1 and first.json()["resolved"] == 1
    assert again.status_code == 200 and again.json()["duplicates"] == 1
    assert get(db, msg.id).status == Status.SENT
    (row,) = stored(db)
    assert (row.provider, row.kind, row.message_id) == ("mailgun", "delivered", msg.id)
    assert "signature" not in row.raw


async def test_a_reused_mailgun_token_carries_nothing_in_whatever_it_carries(db):
    """Mailgun's signature covers the timestamp and token, not the event: a captured request
    replayed with another event under its signature must change nothing."""
    tenant_id, _ = new_tenant(db)
    victim = unknown_message(db, to="victim@example.com", tenant_id=tenant_id)
    genuine = signed_mailgun(mailgun_event("opened"))
    forged = {
        **genuine,
        "event-data": mailgun_event(
            "failed",
            victim.id,
            severity="permanent",
            reason="bounce",
            recipient="victim@example.com",
        ),
    }
    async with api_client(db, **SETTINGS) as api:
        first = await post_mailgun(api, genuine)
        replay = await post_mailgun(api, forged)
    assert first.json()["stored"] == 1
    assert replay.status_code == 200 and replay.json()["stored"] == 0
    assert replay.json()["duplicates"] == 1
    assert suppressed(db) == [] and get(db, victim.id).status == Status.UNKNOWN
    assert [row.kind for row in stored(db)] == ["opened"]


async def test_wrongly_signed_unsigned_or_stale_mailgun_events_are_refused(db):
    data = mailgun_event("delivered")
    async with api_client(db, **SETTINGS) as api:
        wrong = await post_mailgun(api, signed_mailgun(data, key="another-key"))
        stale = await post_mailgun(api, signed_mailgun(data, at=time.time() - 10 * 60))
        unsigned = await post_mailgun(api, {"event-data": data})
        not_json = await api.post("/v1/webhooks/mailgun", content=b"token=abc&signature=x")
    async with api_client(db) as api:  # no key configured: the endpoint is off
        off = await post_mailgun(api, signed_mailgun(data))
    assert (wrong.status_code, stale.status_code) == (403, 403)
    assert (unsigned.status_code, not_json.status_code, off.status_code) == (401, 401, 404)
    assert stored(db) == []


async def test_mailgun_events_mailbag_cannot_use_are_406_and_unknown_types_ignored(db):
    async with api_client(db, **SETTINGS) as api:
        malformed = await post_mailgun(api, signed_mailgun({"event": "delivered"}))
        unknown = await post_mailgun(api, signed_mailgun(mailgun_event("stored")))
    assert malformed.status_code == 406  # Mailgun's "rejected, do not retry"
    assert malformed.json()["type"].endswith("/invalid-event")
    assert unknown.status_code == 200 and unknown.json()["ignored"] == 1
    assert stored(db) == []


async def test_a_permanent_mailgun_failure_suppresses_and_a_temporary_one_does_not(db):
    tenant_id, _ = new_tenant(db)
    msg = unknown_message(db, to="user0@example.com", tenant_id=tenant_id)
    async with api_client(db, **SETTINGS) as api:
        temporary = await post_mailgun(
            api, signed_mailgun(mailgun_event("failed", msg.id, severity="temporary"))
        )
        assert temporary.json()["suppressed"] == 0 and suppressed(db) == []
        permanent = await post_mailgun(
            api,
            signed_mailgun(mailgun_event("failed", msg.id, severity="permanent", reason="bounce")),
        )
    assert permanent.json()["suppressed"] == 1
    assert suppressed(db) == ["user0@example.com"]
    assert get(db, msg.id).status == Status.SENT


async def test_the_reconciler_settles_an_unknown_mailgun_send_from_the_events_api(db, async_engine):
    known = unknown_message(db, to="known@example.com")
    nobody = unknown_message(db, to="nobody@example.com")
    with MailgunServer() as mailgun:
        provider = MailgunProvider(
            api_key=mailgun.api_key, domain=mailgun.domain, base_url=mailgun.url
        )
        # Mailgun did take `known` (the ambiguous send reached it), never `nobody`.
        sent = await provider.send(
            outgoing_email(0, message_id=known.id, to_email="known@example.com")
        )
        reconciler = Reconciler(async_engine, providers={"mailgun": provider})
        outcomes = await reconciler.run_once(datetime.now(UTC))
        await provider.aclose()
        assert mailgun.violations == []
    assert outcomes == {"resolved_sent": 1, "waiting": 1}
    settled = get(db, known.id)
    assert settled.status == Status.SENT and settled.provider_message_id == sent.provider_message_id
    assert get(db, nobody.id).status == Status.UNKNOWN
