"""Provider webhooks at the boundary, on each database: where the secret may come from, what
an unusable event does to its batch (nothing), that every field is storable, that bodies
stay out of logs, and that SNS messages must be recent and signed by a valid certificate."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from api_helpers import api_client
from mailbag.store.schema import provider_events

from conftest import TestDB
from sns_signing import SnsSigner, notification, shared_signer, sns_time

SECRETS = {"brevo_webhook_secret": "brevo-secret", "ses_webhook_secret": "ses-secret"}
MARKER = "private-body-text-7f3a"  # must never reach a log line
TEN_K = "x" * 10_000
T0 = 1_764_460_000_000  # ts_epoch, milliseconds (2025-11-30)


def brevo(n: int, **fields: Any) -> dict[str, Any]:
    """A delivered event, told apart from the others by its time."""
    return {
        "event": "delivered",
        "email": f"user{n}@example.com",
        "message-id": f"<{n}@relay.example>",
        "ts_epoch": T0 + n,
        "reason": f"ok {MARKER}",
        **fields,
    }


def post_brevo(api: Any, body: str | bytes) -> Any:
    return api.post(
        "/v1/webhooks/brevo",
        content=body,
        headers={"Content-Type": "application/json", "X-Mailbag-Webhook-Secret": "brevo-secret"},
    )


def stored(db: TestDB) -> list[Any]:
    with db.engine.connect() as conn:
        return list(conn.execute(select(provider_events).order_by(provider_events.c.id)).all())


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"in": value}
    return value


# --- where the secret comes from ---------------------------------------------------------------


@pytest.mark.parametrize(
    "how",
    [
        {"headers": {"X-Mailbag-Webhook-Secret": "brevo-secret"}},  # Brevo's webhook `headers`
        {"headers": {"Authorization": "Bearer brevo-secret"}},  # Brevo's `auth` type bearer
        {"auth": ("brevo", "brevo-secret")},  # userinfo in the webhook URL
        {"params": {"secret": "brevo-secret"}},
    ],
    ids=["custom-header", "bearer", "basic", "query"],
)
async def test_the_brevo_secret_is_accepted_in_a_header_or_the_query(db, how):
    async with api_client(db, **SECRETS) as api:
        r = await api.post("/v1/webhooks/brevo", json=brevo(1), **how)
    assert r.status_code == 200 and r.json()["stored"] == 1


async def test_a_wrong_secret_in_the_header_is_not_rescued_by_the_query(db):
    async with api_client(db, **SECRETS) as api:
        r = await api.post(
            "/v1/webhooks/brevo",
            json=brevo(1),
            headers={"X-Mailbag-Webhook-Secret": "wrong"},
            params={"secret": "brevo-secret"},
        )
        assert r.status_code == 401
        lower = await api.post(
            "/v1/webhooks/brevo", json=brevo(2), headers={"x-mailbag-webhook-secret": "wrong!"}
        )
        assert lower.status_code == 401
    assert stored(db) == []


# --- bad events: stored if usable, skipped if not, never a 500 ---------------------------------


async def test_one_bad_event_does_not_take_its_batch_down(db, capsys):
    usable = [
        brevo(1),
        brevo(2, reason=f"NUL\x00inside {MARKER}", email="nul\x00@example.com"),
        brevo(3, **{"message-id": TEN_K, "reason": TEN_K, "email": TEN_K, "link": TEN_K}),
        brevo(4, email=123, reason=["a", 1], **{"message-id": {"a": 1}}),
        brevo(5, reason="lone \ud800 surrogate", headers=nested(200)),
        brevo(6, extra=float("nan"), big=10**30, **{"X-Mailbag-Message-ID": "\x00"}),
        brevo(7, ts_epoch="abc", ts=1_764_460_000),  # a bad field, a good fallback
    ]
    unusable = [
        {"email": "no-name@example.com", "ts_epoch": T0},
        brevo(8, event="no_such_event"),
        brevo(9, ts_epoch=253_402_300_800_000),  # year 10000
        brevo(10, ts_epoch=None, ts="x"),  # no time at all
        42,
    ]
    body = json.dumps([*usable[:3], unusable[0], *usable[3:], *unusable[1:]], allow_nan=True)
    async with api_client(db, **SECRETS) as api:
        r = await post_brevo(api, body)
        assert r.status_code == 200, r.text
        assert r.json()["stored"] == len(usable) and r.json()["skipped"] == len(unusable)
        again = await post_brevo(api, body)  # the provider's resend: all duplicates
        assert again.json()["duplicates"] == len(usable)
    rows = stored(db)
    assert len(rows) == len(usable)
    by_time = {row.raw.get("ts_epoch"): row for row in rows}
    nul = by_time[T0 + 2]
    assert nul.detail == f"NUL\ufffdinside {MARKER}" and "\x00" not in json.dumps(nul.raw)
    long = by_time[T0 + 3]
    assert long.provider_message_id is None and long.recipient is None
    assert long.detail == TEN_K[:2000] and long.raw["reason"] == TEN_K  # raw kept whole
    assert by_time[T0 + 4].recipient is None and by_time[T0 + 4].provider_message_id is None
    assert by_time[T0 + 5].detail == "lone \ufffd surrogate"
    assert json.dumps(by_time[T0 + 5].raw).count('"in"') < 40  # cut deep: MariaDB stores it
    odd = by_time[T0 + 6].raw
    assert odd["extra"] is None and odd["big"] == str(10**30)
    assert MARKER not in capsys.readouterr().err  # no body in any log line


@pytest.mark.parametrize(
    "body",
    [
        json.dumps([brevo(1, event="nope"), {"no": "event"}]),  # nothing usable
        json.dumps(brevo(1, ts_epoch=-(10**20))),
        "[" * 100_000 + "]" * 100_000,  # deeper than the JSON parser goes
        b"\xff\xfe not json",
        json.dumps("just a string"),
    ],
    ids=["all-unusable", "bad-time", "too-deep", "not-utf8", "not-an-event"],
)
async def test_a_body_with_nothing_usable_is_400_and_stores_nothing(db, body, capsys):
    async with api_client(db, **SECRETS) as api:
        r = await post_brevo(api, body)
    assert r.status_code == 400 and r.json()["type"].endswith("/invalid-event")
    assert len(r.json()["detail"]) <= 200
    assert stored(db) == []
    assert MARKER not in capsys.readouterr().err


# --- SES through SNS ----------------------------------------------------------------------------


def ses_record(**mail: Any) -> dict[str, Any]:
    return {
        "eventType": "Bounce",
        "mail": {
            "timestamp": "2026-11-30T06:10:00.000Z",
            "messageId": "0100-ses-id",
            "destination": ["a@example.com"],
            **mail,
        },
        "bounce": {
            "bounceType": "Permanent",
            "timestamp": "2026-11-30T06:10:01.000Z",
            "feedbackId": "feedback-1",
            "bouncedRecipients": [{"emailAddress": "a@example.com", "diagnosticCode": MARKER}],
        },
    }


async def post_ses(api: Any, envelope: dict[str, Any]) -> Any:
    return await api.post(
        "/v1/webhooks/ses",
        content=json.dumps(envelope),
        headers={"Content-Type": "text/plain", "X-Mailbag-Webhook-Secret": "ses-secret"},
    )


def trust(api: Any, signer: SnsSigner) -> None:
    api._transport.app.state.sns_certificates.put(signer.cert_url, signer.certificate_pem)


async def test_ses_fields_with_nul_and_overlong_values_are_stored(db, capsys):
    record = ses_record(messageId=TEN_K, source="a\x00b", extra=float("nan"))
    record["bounce"]["bouncedRecipients"][0]["emailAddress"] = "nul\x00@example.com"
    message = json.dumps(record, allow_nan=True)
    async with api_client(db, **SECRETS) as api:
        trust(api, shared_signer())
        r = await post_ses(api, shared_signer().sign(notification(message)))
    assert r.status_code == 200, r.text
    (row,) = stored(db)
    assert row.provider_message_id is None and row.raw["mail"]["source"] == "a\ufffdb"
    assert row.raw["mail"]["extra"] is None
    assert MARKER not in capsys.readouterr().err


async def test_an_ses_record_with_an_impossible_time_is_400(db):
    record = ses_record()
    record["bounce"]["timestamp"] = "0001-01-01T00:00:00+14:00"  # overflows on the way to UTC
    async with api_client(db, **SECRETS) as api:
        trust(api, shared_signer())
        r = await post_ses(api, shared_signer().sign(notification(record)))
        assert r.status_code == 400
        record["bounce"]["timestamp"] = "0999-12-31T23:59:59Z"  # before any DATETIME
        r = await post_ses(api, shared_signer().sign(notification(record)))
        assert r.status_code == 400
    assert stored(db) == []


@pytest.mark.parametrize(
    ("age", "accepted"),
    [
        (timedelta(minutes=59), True),
        (timedelta(hours=2), False),  # SNS gave up retrying long ago: a replay
        (timedelta(minutes=-30), False),  # from the future
    ],
)
async def test_sns_messages_must_be_recent(db, age, accepted):
    sent = sns_time(datetime.now(UTC) - age)
    async with api_client(db, **SECRETS) as api:
        trust(api, shared_signer())
        r = await post_ses(api, shared_signer().sign(notification(ses_record(), timestamp=sent)))
    if accepted:
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 403 and r.json()["type"].endswith("/stale-message")
        assert stored(db) == []


@pytest.mark.parametrize("which", ["expired", "not-yet-valid"])
async def test_a_certificate_outside_its_validity_is_refused(db, which):
    now = datetime.now(UTC)
    window = (
        (now - timedelta(days=30), now - timedelta(days=1))
        if which == "expired"
        else (now + timedelta(days=1), now + timedelta(days=30))
    )
    signer = SnsSigner.create(valid_from=window[0], valid_until=window[1])
    async with api_client(db, **SECRETS) as api:
        trust(api, signer)
        r = await post_ses(api, signer.sign(notification(ses_record())))
    assert r.status_code == 403 and r.json()["type"].endswith("/invalid-signature")
    assert "valid" in r.json()["detail"]
    assert stored(db) == []
