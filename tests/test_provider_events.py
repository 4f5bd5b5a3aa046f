"""Provider delivery events: Brevo and SES (via SNS) webhook payloads, normalized; SNS
signatures. Pure: recorded payloads in tests/data/webhooks, a local signing key, no network."""

from __future__ import annotations

import copy
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from mailbag.api.webhooks import SnsCertificates
from mailbag.domain.events import (
    BounceType,
    EventKind,
    InvalidPayload,
    ProviderEvent,
    UnsupportedEvent,
    message_id_from_value,
    proves_acceptance,
    suppresses,
)
from mailbag.providers import event_fields
from mailbag.providers import ses as ses_provider
from mailbag.providers.brevo_events import BREVO_EVENTS, parse_brevo_events, parse_brevo_webhook
from mailbag.providers.ses_events import (
    DEFAULT_CERT_HOSTS,
    MESSAGE_ID_TAG,
    SES_EVENTS,
    InvalidSignature,
    InvalidSnsMessage,
    SnsMessageType,
    StaleMessage,
    check_fresh,
    is_trusted_cert_url,
    parse_ses_notification,
    parse_sns_envelope,
    sns_string_to_sign,
    verify_sns_signature,
)

from sns_signing import SnsSigner, notification, shared_signer, sns_time, string_to_sign

DATA = Path(__file__).parent / "data" / "webhooks"
K, B = EventKind, BounceType


def load(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def ses_events_in(name: str) -> list[ProviderEvent]:
    return parse_ses_notification(parse_sns_envelope(json.dumps(load(name))).message)


def all_recorded_events() -> list[ProviderEvent]:
    events = [
        e
        for path in sorted(DATA.glob("brevo/*.json"))
        for e in parse_brevo_webhook(load(f"brevo/{path.name}"))
    ]
    for path in sorted(DATA.glob("ses/notification_*.json")):
        events += ses_events_in(f"ses/{path.name}")
    return events


# --- Brevo -----------------------------------------------------------------------------------

M1 = "<202611300610.10000000001@smtp-relay.mailin.fr>"
U1 = uuid.UUID("0192f0c4-5b8e-7c3a-9d2e-4f6a8b1c2d3e")

BREVO_CASES = [
    # file, kind, bounce type, provider message id, our message id, recipient
    ("request", K.ACCEPTED, None, M1, U1, "ada@example.com"),
    ("delivered", K.DELIVERED, None, M1, U1, "ada@example.com"),
    (
        "deferred",
        K.DEFERRED,
        None,
        "<202611300611.10000000002@smtp-relay.mailin.fr>",
        None,
        "grace@example.org",
    ),
    (
        "hard_bounce",
        K.BOUNCED,
        B.HARD,
        "<202611300612.10000000003@smtp-relay.mailin.fr>",
        uuid.UUID("0192f0c4-7a10-7e55-8b21-3c4d5e6f7a8b"),
        "Nobody@example.com",  # the domain is lowercased, the local part kept
    ),
    (
        "soft_bounce",
        K.BOUNCED,
        B.SOFT,
        "<202611300613.10000000004@smtp-relay.mailin.fr>",
        uuid.UUID("0192f0c5-0c2d-7f01-a3b4-5c6d7e8f9a0b"),  # under "headers"
        "linus@example.net",
    ),
    (
        "blocked",
        K.REJECTED,
        None,
        "<202611300614.10000000005@smtp-relay.mailin.fr>",
        None,
        "blocked@example.com",
    ),
    ("spam", K.COMPLAINED, None, M1, None, "ada@example.com"),
    (
        "invalid_email",
        K.REJECTED,
        None,
        "<202611300615.10000000006@smtp-relay.mailin.fr>",
        None,
        "not-an-address@example",  # invalid, still kept: Brevo saw it
    ),
    ("opened", K.OPENED, None, M1, None, "ada@example.com"),
    (
        "click",
        K.CLICKED,
        None,
        "<0192f0c6-1e2f-7a3b-8c4d-5e6f7a8b9c0d@mail.example.com>",
        uuid.UUID("0192f0c6-1e2f-7a3b-8c4d-5e6f7a8b9c0d"),  # Brevo kept our Message-Id
        "ada@example.com",
    ),
    ("unsubscribed", K.UNSUBSCRIBED, None, M1, None, "ada@example.com"),
]


@pytest.mark.parametrize(
    ("name", "kind", "bounce_type", "provider_id", "our_id", "recipient"), BREVO_CASES
)
def test_recorded_brevo_payloads_parse(
    name: str,
    kind: EventKind,
    bounce_type: BounceType | None,
    provider_id: str,
    our_id: uuid.UUID | None,
    recipient: str,
) -> None:
    payload = load(f"brevo/{name}.json")
    (event,) = parse_brevo_webhook(payload)
    assert event.provider == "brevo"
    assert event.provider_event == payload["event"]
    assert (event.kind, event.bounce_type) == (kind, bounce_type)
    assert event.provider_message_id == provider_id
    assert event.message_id == our_id
    assert event.recipient == recipient
    assert event.occurred_at == datetime.fromtimestamp(payload["ts_epoch"] / 1000, UTC)
    assert event.raw == payload
    assert event.dedup_key.startswith("brevo:")


def test_brevo_details_are_the_reason_or_the_clicked_link() -> None:
    (bounce,) = parse_brevo_webhook(load("brevo/hard_bounce.json"))
    assert bounce.detail is not None and bounce.detail.startswith("RecipientError: 550 5.1.1")
    (click,) = parse_brevo_webhook(load("brevo/click.json"))
    assert click.detail == "https://app.example.com/verify?token=abc"
    (opened,) = parse_brevo_webhook(load("brevo/opened.json"))
    assert opened.detail is None


def brevo_event(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "event": name,
        "email": "ada@example.com",
        "message-id": M1,
        "ts_epoch": 1796019000417,
        **fields,
    }


@pytest.mark.parametrize("name", sorted(BREVO_EVENTS))
def test_every_brevo_event_name_in_the_table_parses(name: str) -> None:
    (event,) = parse_brevo_webhook(brevo_event(name))
    assert (event.kind, event.bounce_type) == BREVO_EVENTS[name]


def test_a_batched_brevo_body_gives_one_event_each() -> None:
    body = [load("brevo/request.json"), load("brevo/delivered.json")]
    assert [e.kind for e in parse_brevo_webhook(body)] == [K.ACCEPTED, K.DELIVERED]


def test_an_unknown_brevo_event_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedEvent) as caught:
        parse_brevo_webhook(brevo_event("list_addition"))
    assert (caught.value.provider, caught.value.event_name) == ("brevo", "list_addition")
    # One unknown event refuses the whole batch: nothing is half-recorded.
    with pytest.raises(UnsupportedEvent):
        parse_brevo_webhook([load("brevo/request.json"), brevo_event("list_addition")])


@pytest.mark.parametrize(
    "body",
    [
        {"email": "ada@example.com", "ts_epoch": 1},  # no event name
        {"event": "delivered", "email": "ada@example.com", "date": "2026-11-30 07:10:00"},  # no ts
        {"items": []},  # an inbound-parse body sent to the wrong URL
        ["not an object"],
        "delivered",
    ],
)
def test_malformed_brevo_bodies_are_invalid(body: Any) -> None:
    with pytest.raises(InvalidPayload):
        parse_brevo_webhook(body)


def test_brevo_times_prefer_ts_epoch_and_read_seconds_or_milliseconds() -> None:
    expected = datetime(2026, 11, 30, 6, 10, tzinfo=UTC)
    (ms,) = parse_brevo_webhook(brevo_event("delivered", ts_epoch=1796019000000, ts_event=1))
    (secs,) = parse_brevo_webhook(brevo_event("delivered", ts_epoch=1796019000))
    (fallback,) = parse_brevo_webhook(brevo_event("delivered", ts_epoch=None, ts_event=1796019000))
    assert ms.occurred_at == secs.occurred_at == fallback.occurred_at == expected


def test_brevo_custom_header_names_match_case_insensitively() -> None:
    (event,) = parse_brevo_webhook(brevo_event("delivered", **{"x-mailbag-message-id": str(U1)}))
    assert event.message_id == U1


# --- SES -------------------------------------------------------------------------------------

S = "0102018f1a2b3c"
SES_CASES = [
    # file, [(kind, bounce type, recipient)], provider message id, our message id (how found)
    (
        "notification_send",
        [(K.ACCEPTED, None, "ada@example.com")],
        f"{S}4d-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9-000000",
        "0192f0d0-1111-7aaa-8bbb-0123456789ab",  # tag only
    ),
    (
        "notification_delivery",
        [(K.DELIVERED, None, "Grace@example.org")],
        f"{S}4e-6f7a8b9c-0d1e-4f2a-b3c4-d5e6f7a8b9c0-000000",
        "0192f0d0-2222-7bbb-9ccc-123456789abc",  # header (and tag)
    ),
    (
        "notification_bounce_permanent",
        [(K.BOUNCED, B.HARD, "nobody@example.com"), (K.BOUNCED, B.HARD, "gone@example.net")],
        f"{S}4f-7a8b9c0d-1e2f-4a3b-c4d5-e6f7a8b9c0d1-000000",
        "0192f0d0-3333-7ccc-addd-23456789abcd",  # our Message-ID only
    ),
    (
        "notification_complaint",
        [(K.COMPLAINED, None, "ada@example.com")],
        f"{S}50-8b9c0d1e-2f3a-4b4c-d5e6-f7a8b9c0d1e2-000000",
        None,  # no headers, no tags
    ),
    (
        "notification_reject",
        [(K.REJECTED, None, "ada@example.com")],
        f"{S}51-9c0d1e2f-3a4b-4c5d-e6f7-a8b9c0d1e2f3-000000",
        "0192f0d0-5555-7eee-8fff-456789abcdef",
    ),
    (
        "notification_delivery_delay",
        [(K.DEFERRED, None, "linus@example.net")],
        f"{S}52-0d1e2f3a-4b5c-4d6e-f7a8-b9c0d1e2f3a4-000000",
        "0192f0d0-6666-7fff-9000-56789abcdef0",
    ),
]


@pytest.mark.parametrize(("name", "expected", "provider_id", "our_id"), SES_CASES)
def test_recorded_ses_notifications_parse(
    name: str,
    expected: list[tuple[EventKind, BounceType | None, str]],
    provider_id: str,
    our_id: str | None,
) -> None:
    envelope = load(f"ses/{name}.json")
    msg = parse_sns_envelope(json.dumps(envelope))
    assert msg.message_type is SnsMessageType.NOTIFICATION
    events = parse_ses_notification(msg.message)
    assert [(e.kind, e.bounce_type, e.recipient) for e in events] == expected
    record = json.loads(envelope["Message"])
    for event in events:
        assert event.provider == "ses"
        assert event.provider_event == record["eventType"]
        assert event.provider_message_id == provider_id
        assert event.message_id == (uuid.UUID(our_id) if our_id else None)
        assert event.occurred_at.tzinfo is not None and event.occurred_at.utcoffset() == timedelta(
            0
        )
        assert event.raw == record


def test_ses_event_times_and_details() -> None:
    first, second = ses_events_in("ses/notification_bounce_permanent.json")
    assert first.occurred_at == datetime(2026, 11, 30, 6, 12, 3, 915000, tzinfo=UTC)
    assert first.detail == (
        "Permanent/General: smtp; 550 5.1.1 <nobody@example.com>: "
        "Recipient address rejected: User unknown"
    )
    assert second.detail is not None and "does not exist" in second.detail
    (delivery,) = ses_events_in("ses/notification_delivery.json")
    assert delivery.detail is not None and delivery.detail.startswith("250 2.0.0 OK")
    (delay,) = ses_events_in("ses/notification_delivery_delay.json")
    assert (
        delay.detail
        == "TransientCommunicationFailure: smtp; 421 4.4.1 Unable to connect to remote host"
    )
    (reject,) = ses_events_in("ses/notification_reject.json")
    assert reject.detail == "Bad content"
    # Send has no event object of its own: the time is when SES took the email.
    (send,) = ses_events_in("ses/notification_send.json")
    assert send.occurred_at == datetime(2026, 11, 30, 6, 10, 0, 512000, tzinfo=UTC)


def ses_record(
    event_type: str, body_key: str | None = None, body: dict[str, Any] | None = None, **mail: Any
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "eventType": event_type,
        "mail": {
            "timestamp": "2026-11-30T06:10:00.000Z",
            "messageId": "0102018f-example-000000",
            "destination": ["ada@example.com"],
            **mail,
        },
    }
    if body_key is not None:
        record[body_key] = body or {}
    return record


@pytest.mark.parametrize(
    ("bounce_type", "expected"),
    [("Permanent", B.HARD), ("Transient", B.SOFT), ("Undetermined", B.SOFT)],
)
def test_ses_bounce_types(bounce_type: str, expected: BounceType) -> None:
    record = ses_record(
        "Bounce",
        "bounce",
        {
            "bounceType": bounce_type,
            "bounceSubType": "General",
            "bouncedRecipients": [{"emailAddress": "ada@example.com"}],
        },
    )
    (event,) = parse_ses_notification(json.dumps(record))
    assert event.bounce_type is expected


@pytest.mark.parametrize("event_type", sorted(SES_EVENTS))
def test_every_ses_event_type_in_the_table_parses(event_type: str) -> None:
    rule = SES_EVENTS[event_type]
    (event,) = parse_ses_notification(ses_record(event_type, rule.body_key))
    assert event.kind is rule.kind
    assert event.recipient == ("ada@example.com" if rule.recipients_key is None else None)


def test_the_older_notification_format_reads_the_same() -> None:
    record = json.loads(load("ses/notification_bounce_permanent.json")["Message"])
    older = {("notificationType" if k == "eventType" else k): v for k, v in record.items()}
    assert [e.dedup_key for e in parse_ses_notification(older)] == [
        e.dedup_key for e in parse_ses_notification(record)
    ]


@pytest.mark.parametrize(
    "message",
    [
        "Successfully validated SNS topic for Amazon SES event publishing.",
        json.dumps(
            {
                "notificationType": "AmazonSnsSubscriptionSucceeded",
                "message": "You have successfully subscribed",
            }
        ),
    ],
)
def test_sns_notices_about_the_topic_give_no_events(message: str) -> None:
    assert parse_ses_notification(message) == []


def test_unknown_or_malformed_ses_records_are_refused() -> None:
    with pytest.raises(UnsupportedEvent) as caught:
        parse_ses_notification(json.dumps({"notificationType": "Received", "mail": {}}))
    assert caught.value.event_name == "Received"
    for bad in (
        "not json",
        "[]",
        json.dumps({"mail": {}}),
        json.dumps(ses_record("Send", mail=None) | {"mail": 3}),
    ):
        with pytest.raises(InvalidPayload):
            parse_ses_notification(bad)
    with pytest.raises(InvalidPayload):  # no time anywhere
        parse_ses_notification({"eventType": "Send", "mail": {"messageId": "x"}})


def test_the_tag_name_matches_the_one_the_ses_provider_sends() -> None:
    assert MESSAGE_ID_TAG == ses_provider.MESSAGE_ID_TAG


# --- our message id --------------------------------------------------------------------------

OURS = uuid.UUID("0192f0d0-9999-7aaa-8bbb-0123456789ab")
OTHER = uuid.UUID("0192f0d0-8888-7aaa-8bbb-0123456789ab")
THIRD = uuid.UUID("0192f0d0-7777-7aaa-8bbb-0123456789ab")


def test_our_id_is_taken_from_header_then_tag_then_message_id() -> None:
    headers = [
        {"name": "Message-ID", "value": f"<{THIRD}@mail.example.com>"},
        {"name": "x-mailbag-message-id", "value": str(OURS)},
    ]
    tags = {MESSAGE_ID_TAG: [str(OTHER)]}

    def our_id(**mail: Any) -> uuid.UUID | None:
        (event,) = parse_ses_notification(ses_record("Send", "send", **mail))
        return event.message_id

    assert our_id(headers=headers, tags=tags) == OURS
    assert our_id(headers=headers[:1], tags=tags) == OTHER
    assert our_id(headers=headers[:1]) == THIRD
    assert our_id(commonHeaders={"messageId": f"<{THIRD}@mail.example.com>"}) == THIRD
    assert our_id(headers=[{"name": "Message-ID", "value": "<CAF1x=abc@mail.gmail.com>"}]) is None
    assert our_id() is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (str(OURS), OURS),
        (f" {str(OURS).upper()} ", OURS),
        (f"<{OURS}@mail.example.com>", OURS),
        (f"{OURS}@mail.example.com", OURS),
        (OURS.hex, None),  # 32 hex digits: someone else's Message-ID, not ours
        (f"<{OURS.hex}@mail.example.com>", None),
        ("<202611300610.12345@smtp-relay.mailin.fr>", None),
        (f"urn:uuid:{OURS}", None),
        ("", None),
        (None, None),
        (12, None),
    ],
)
def test_message_id_from_value(value: object, expected: uuid.UUID | None) -> None:
    assert message_id_from_value(value) == expected


# --- dedup keys ------------------------------------------------------------------------------


def test_a_resent_event_has_the_same_dedup_key() -> None:
    for path in sorted(DATA.glob("brevo/*.json")):
        payload = load(f"brevo/{path.name}")
        assert parse_brevo_webhook(payload) == parse_brevo_webhook(copy.deepcopy(payload))
    for path in sorted(DATA.glob("ses/notification_*.json")):
        envelope = load(f"ses/{path.name}")
        # SNS may deliver the same record again, even under a new envelope.
        again = notification(envelope["Message"], message_id=str(uuid.uuid4()))
        first = parse_ses_notification(parse_sns_envelope(json.dumps(envelope)).message)
        second = parse_ses_notification(
            parse_sns_envelope(json.dumps(shared_signer().sign(again))).message
        )
        assert [e.dedup_key for e in first] == [e.dedup_key for e in second]


def test_different_events_have_different_dedup_keys() -> None:
    keys = [e.dedup_key for e in all_recorded_events()]
    assert len(keys) == len(set(keys)) == 11 + 7  # 11 Brevo; 7 SES (the bounce names two)


def test_brevo_dedup_keys_tell_apart_events_of_one_message() -> None:
    def key(**fields: Any) -> str:
        (event,) = parse_brevo_webhook(brevo_event("opened", **fields))
        return event.dedup_key

    base = key()
    assert key(ts_epoch=1796019060417) != base  # a second open, a minute later
    assert key(email="grace@example.org") != base
    assert key(**{"message-id": "<other@smtp-relay.mailin.fr>"}) != base
    (unique,) = parse_brevo_webhook(brevo_event("unique_opened"))
    assert unique.dedup_key != base
    first, second = (
        parse_brevo_webhook(brevo_event("click", link=link))[0].dedup_key
        for link in ("https://a.example/", "https://b.example/")
    )
    assert first != second


# --- what an event means ---------------------------------------------------------------------


def make_event(kind: EventKind, bounce_type: BounceType | None = None) -> ProviderEvent:
    return ProviderEvent(
        provider="ses",
        kind=kind,
        provider_event=str(kind),
        bounce_type=bounce_type,
        occurred_at=datetime(2026, 11, 30, tzinfo=UTC),
        provider_message_id=None,
        message_id=None,
        recipient="ada@example.com",
        dedup_key="ses:x",
        detail=None,
        raw={},
    )


TRUTH_TABLE = [
    # kind, bounce type, suppresses, proves acceptance
    (K.ACCEPTED, None, False, True),
    (K.DELIVERED, None, False, True),
    (K.DEFERRED, None, False, True),
    (K.BOUNCED, B.HARD, True, True),
    (K.BOUNCED, B.SOFT, False, True),
    (K.COMPLAINED, None, True, True),
    (K.REJECTED, None, False, False),
    (K.OPENED, None, False, True),
    (K.CLICKED, None, False, True),
    (K.UNSUBSCRIBED, None, False, True),
]


def test_the_truth_table_covers_every_kind() -> None:
    assert {row[0] for row in TRUTH_TABLE} == set(EventKind)


@pytest.mark.parametrize(("kind", "bounce_type", "suppressed", "accepted"), TRUTH_TABLE)
def test_suppresses_and_proves_acceptance(
    kind: EventKind, bounce_type: BounceType | None, suppressed: bool, accepted: bool
) -> None:
    event = make_event(kind, bounce_type)
    assert suppresses(event) is suppressed
    assert proves_acceptance(event) is accepted


def test_an_event_keeps_its_invariants() -> None:
    with pytest.raises(ValueError, match="bounce_type"):
        make_event(K.BOUNCED)
    with pytest.raises(ValueError, match="bounce_type"):
        make_event(K.DELIVERED, B.HARD)
    naive = make_event(K.DELIVERED).occurred_at.replace(tzinfo=None)
    with pytest.raises(ValueError, match="UTC"):
        ProviderEvent(**{**make_event(K.DELIVERED).__dict__, "occurred_at": naive})


# --- SNS envelopes and signatures ------------------------------------------------------------


@pytest.fixture(scope="module")
def signer() -> SnsSigner:
    return shared_signer()


def test_a_subscription_confirmation_parses() -> None:
    msg = parse_sns_envelope(json.dumps(load("ses/subscription_confirmation.json")).encode())
    assert msg.message_type is SnsMessageType.SUBSCRIPTION_CONFIRMATION
    assert msg.token is not None and msg.token.startswith("2336412f37")
    assert msg.subscribe_url is not None and "Action=ConfirmSubscription" in msg.subscribe_url
    assert msg.sent_at == datetime(2026, 11, 30, 6, 0, 4, 751000, tzinfo=UTC)


@pytest.mark.parametrize("version", ["1", "2"])
@pytest.mark.parametrize("name", [p.name for p in sorted(DATA.glob("ses/*.json"))])
def test_validly_signed_messages_verify(signer: SnsSigner, name: str, version: str) -> None:
    msg = parse_sns_envelope(json.dumps(signer.sign(load(f"ses/{name}"), version)))
    assert msg.signature_version == version
    verify_sns_signature(msg, signer.certificate_pem)


def test_a_notification_without_subject_verifies(signer: SnsSigner) -> None:
    envelope = signer.sign(notification("hello", subject=None))
    assert b"Subject" not in sns_string_to_sign(parse_sns_envelope(json.dumps(envelope)))
    verify_sns_signature(parse_sns_envelope(json.dumps(envelope)), signer.certificate_pem)


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("notification_bounce_permanent", "Message", '{"eventType":"Delivery"}'),
        ("notification_bounce_permanent", "Subject", "Something else"),
        ("notification_bounce_permanent", "Timestamp", "2026-11-30T06:12:04.212Z"),
        ("notification_bounce_permanent", "TopicArn", "arn:aws:sns:eu-west-1:999999999999:other"),
        ("notification_bounce_permanent", "MessageId", "00000000-0000-0000-0000-000000000000"),
        (
            "subscription_confirmation",
            "SubscribeURL",
            "https://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription&Token=evil",
        ),
        ("subscription_confirmation", "Token", "0000"),
        ("subscription_confirmation", "Message", "Please confirm"),
    ],
)
@pytest.mark.parametrize("version", ["1", "2"])
def test_a_tampered_message_does_not_verify(
    signer: SnsSigner, name: str, key: str, value: str, version: str
) -> None:
    tampered = {**signer.sign(load(f"ses/{name}.json"), version), key: value}
    with pytest.raises(InvalidSignature):
        verify_sns_signature(parse_sns_envelope(json.dumps(tampered)), signer.certificate_pem)


def test_the_confirmation_string_to_sign_covers_subscribe_url_and_token() -> None:
    envelope = load("ses/subscription_confirmation.json")
    signed = sns_string_to_sign(parse_sns_envelope(json.dumps(envelope)))
    assert signed == string_to_sign(envelope)
    assert f"SubscribeURL\n{envelope['SubscribeURL']}\n".encode() in signed
    assert f"Token\n{envelope['Token']}\n".encode() in signed
    assert signed.startswith(b"Message\n") and signed.endswith(b"Type\nSubscriptionConfirmation\n")


def test_the_notification_string_to_sign_is_the_documented_one() -> None:
    envelope = load("ses/notification_delivery.json")
    assert (
        sns_string_to_sign(parse_sns_envelope(json.dumps(envelope)))
        == (
            f"Message\n{envelope['Message']}\nMessageId\n{envelope['MessageId']}\n"
            f"Subject\n{envelope['Subject']}\nTimestamp\n{envelope['Timestamp']}\n"
            f"TopicArn\n{envelope['TopicArn']}\nType\nNotification\n"
        ).encode()
    )


def test_a_signature_from_another_key_does_not_verify(signer: SnsSigner) -> None:
    impostor = SnsSigner.create()
    msg = parse_sns_envelope(json.dumps(impostor.sign(load("ses/notification_send.json"))))
    with pytest.raises(InvalidSignature):
        verify_sns_signature(msg, signer.certificate_pem)
    verify_sns_signature(msg, impostor.certificate_pem)


def test_a_signature_checked_under_the_other_version_does_not_verify(signer: SnsSigner) -> None:
    relabeled = {**signer.sign(load("ses/notification_send.json"), "1"), "SignatureVersion": "2"}
    with pytest.raises(InvalidSignature):
        verify_sns_signature(parse_sns_envelope(json.dumps(relabeled)), signer.certificate_pem)


def test_unusable_signatures_and_certificates_do_not_verify(signer: SnsSigner) -> None:
    envelope = signer.sign(load("ses/notification_send.json"))
    with pytest.raises(InvalidSignature):
        verify_sns_signature(
            parse_sns_envelope(json.dumps({**envelope, "Signature": "not base64!"})),
            signer.certificate_pem,
        )
    msg = parse_sns_envelope(json.dumps(envelope))
    with pytest.raises(InvalidSignature):
        verify_sns_signature(msg, b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    with pytest.raises(InvalidSignature, match="not valid"):
        verify_sns_signature(
            msg, signer.certificate_pem, now=datetime.now(UTC) + timedelta(days=365)
        )
    verify_sns_signature(msg, signer.certificate_pem, now=datetime.now(UTC))


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        json.dumps({"Type": "Something", "MessageId": "x"}),
        json.dumps(
            {k: v for k, v in load("ses/subscription_confirmation.json").items() if k != "Token"}
        ),
        json.dumps({**load("ses/notification_send.json"), "SignatureVersion": "3"}),
        json.dumps({**load("ses/notification_send.json"), "Message": {"eventType": "Send"}}),
        json.dumps({**load("ses/notification_send.json"), "Subject": 7}),
    ],
)
def test_malformed_sns_bodies_are_refused(body: bytes | str) -> None:
    with pytest.raises(InvalidSnsMessage):
        parse_sns_envelope(body)


@pytest.mark.parametrize(
    ("url", "trusted"),
    [
        ("https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem", True),
        ("https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem", True),
        ("https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem", True),
        ("https://SNS.US-EAST-1.AMAZONAWS.COM/SimpleNotificationService-abc.pem", True),
        ("http://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem", False),
        ("https://example.com/SimpleNotificationService-abc.pem", False),
        ("https://s3.amazonaws.com/sns.us-east-1.amazonaws.com/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com.evil.com/cert.pem", False),
        ("https://evilsns.us-east-1.amazonaws.com/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.co/cert.pem", False),
        ("https://sns.us-east-1.evil.amazonaws.com/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com./cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com@evil.com/cert.pem", False),
        ("https://evil.com@sns.us-east-1.amazonaws.com/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com\\@evil.com/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com:443.evil.com/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com\n.evil.com/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com%2eevil.com/cert.pem", False),
        ("//sns.us-east-1.amazonaws.com/cert.pem", False),
        ("", False),
    ],
)
def test_cert_urls_are_trusted_only_on_amazon_sns_hosts_over_https(url: str, trusted: bool) -> None:
    assert is_trusted_cert_url(url) is trusted


def test_a_test_may_trust_its_own_cert_host() -> None:
    assert is_trusted_cert_url(
        "https://localhost:8443/cert.pem", allowed_hosts_pattern=r"^localhost$"
    )
    assert not is_trusted_cert_url(
        "http://localhost:8443/cert.pem", allowed_hosts_pattern=r"^localhost$"
    )
    assert not is_trusted_cert_url(
        "https://localhost.evil.com/cert.pem", allowed_hosts_pattern=r"^localhost$"
    )


def test_a_signed_recorded_notification_end_to_end(signer: SnsSigner) -> None:
    body = json.dumps(signer.sign(load("ses/notification_bounce_permanent.json"), "2")).encode()
    msg = parse_sns_envelope(body)
    assert is_trusted_cert_url(msg.signing_cert_url)
    verify_sns_signature(msg, signer.certificate_pem)
    events = parse_ses_notification(msg.message)
    assert [(e.recipient, suppresses(e), proves_acceptance(e)) for e in events] == [
        ("nobody@example.com", True, True),
        ("gone@example.net", True, True),
    ]


# --- replays, certificates, storable fields ----------------------------------------------------


def test_an_sns_message_older_than_an_hour_is_a_replay(signer: SnsSigner) -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    def sent(at: datetime) -> Any:
        return parse_sns_envelope(
            json.dumps(signer.sign(notification("x", timestamp=sns_time(at))))
        )

    check_fresh(sent(now - timedelta(minutes=59)), now)
    check_fresh(sent(now + timedelta(minutes=2)), now)  # clocks disagree a little
    for at in (now - timedelta(hours=2), now + timedelta(hours=1)):
        with pytest.raises(StaleMessage):
            check_fresh(sent(at), now)
    garbled = {**signer.sign(notification("x")), "Timestamp": "yesterday"}
    with pytest.raises(StaleMessage):
        check_fresh(parse_sns_envelope(json.dumps(garbled)), now)


def test_an_expired_certificate_does_not_verify() -> None:
    now = datetime.now(UTC)
    expired = SnsSigner.create(valid_from=now - timedelta(days=9), valid_until=now - timedelta(1))
    msg = parse_sns_envelope(json.dumps(expired.sign(notification("x"))))
    verify_sns_signature(msg, expired.certificate_pem)  # the signature itself is good
    with pytest.raises(InvalidSignature, match="not valid"):
        verify_sns_signature(msg, expired.certificate_pem, now=now)


def test_the_certificate_cache_is_bounded_in_size_and_time() -> None:
    now = [0.0]
    cache = SnsCertificates(DEFAULT_CERT_HOSTS, clock=lambda: now[0])
    for n in range(SnsCertificates.SIZE + 10):
        cache.put(f"https://sns.us-east-1.amazonaws.com/{n}.pem", b"pem")
    assert len(cache) == SnsCertificates.SIZE
    assert cache.cached("https://sns.us-east-1.amazonaws.com/0.pem") is None  # the oldest went
    newest = f"https://sns.us-east-1.amazonaws.com/{SnsCertificates.SIZE + 9}.pem"
    assert cache.cached(newest) == b"pem"
    now[0] += SnsCertificates.TTL
    assert cache.cached(newest) is None  # fetched again after TTL: AWS rotates certificates


def test_a_bad_event_in_a_brevo_batch_is_skipped_with_its_reason() -> None:
    good = brevo_event("delivered")
    events, problems = parse_brevo_events([good, {"event": "nope"}, 7, {"email": "x"}])
    assert [e.provider_event for e in events] == ["delivered"]
    assert [type(p) for p in problems] == [UnsupportedEvent, InvalidPayload, InvalidPayload]
    with pytest.raises(UnsupportedEvent):
        parse_brevo_webhook([good, {"event": "nope"}])  # the strict reader: all or nothing


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", "plain"),
        ("a\x00b", "a\ufffdb"),
        ("lone \ud800 half", "lone \ufffd half"),
        ("zoë 😀", "zoë 😀"),
    ],
)
def test_text_is_cleaned_of_what_databases_refuse(value: str, expected: str) -> None:
    assert event_fields.clean(value) == expected
    assert event_fields.text(f"  {value} ", 100) == expected


def test_overlong_ids_are_dropped_and_details_cut() -> None:
    assert event_fields.identifier("x" * 255, 255) == "x" * 255
    assert event_fields.identifier("x" * 256, 255) is None
    assert event_fields.text("x" * 5000, 2000) == "x" * 2000
    assert event_fields.text(12, 10) is None and event_fields.identifier(["a"], 10) is None


def test_raw_json_is_made_storable() -> None:
    deep: Any = "bottom"
    for _ in range(100):
        deep = [deep]
    raw = event_fields.raw_json(
        {
            "a\x00": "b\ud800",
            "nan": float("nan"),
            "inf": float("-inf"),
            "big": -(10**40),
            "ok": [1, 2.5, True, None],
            "deep": deep,
        }
    )
    assert raw["a\ufffd"] == "b\ufffd" and raw["nan"] is None and raw["inf"] is None
    assert raw["big"] == str(-(10**40)) and raw["ok"] == [1, 2.5, True, None]
    text = json.dumps(raw, allow_nan=False)  # no NaN left
    assert text.count("[") <= event_fields.RAW_DEPTH and "nested too deep" in text


def test_event_times_must_be_storable() -> None:
    with pytest.raises(InvalidPayload):
        parse_brevo_webhook(brevo_event("delivered", ts_epoch=253_402_300_800_000))
    with pytest.raises(InvalidPayload):
        parse_ses_notification(ses_record("Send", "send", timestamp="0001-01-01T00:00:00+14:00"))
