"""The Brevo provider against a real HTTP server that behaves like Brevo (tests/brevo_server.py)."""

from __future__ import annotations

import base64
import json
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from mailbag.compose import OutgoingEmail
from mailbag.domain.content import Address, Attachment, Recipients, cid_references
from mailbag.domain.delivery import (
    Accepted,
    Ambiguous,
    Attempt,
    Deferred,
    Disabled,
    Rejected,
    SendOutcome,
    Throttled,
    decide,
)
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.states import Action
from mailbag.providers import Provider, create
from mailbag.providers.brevo import (
    IDEMPOTENCY_NAMESPACE,
    BrevoLookupError,
    BrevoProvider,
    brevo_idempotency_key,
    encode_json,
)
from mailbag.settings import Settings

from brevo_server import SEND_PATH, BrevoServer, Endpoint
from helpers import T0, outgoing_email, tiny_pdf, tiny_png

CLIENT_TIMEOUT = 0.5  # seconds: short, so the "accepted, then silence" cases stay quick


@pytest.fixture
def brevo() -> Iterator[BrevoServer]:
    with BrevoServer() as server:
        yield server


@pytest.fixture
async def provider(brevo: BrevoServer) -> AsyncIterator[BrevoProvider]:
    client = BrevoProvider(
        api_key=brevo.api_key, base_url=brevo.url, timeout=CLIENT_TIMEOUT, max_connections=8
    )
    yield client
    await client.aclose()


def emails(n: int, **overrides: Any) -> list[OutgoingEmail]:
    return [outgoing_email(i, **overrides) for i in range(n)]


def accepted_ids(outcomes: list[SendOutcome]) -> list[str]:
    assert all(isinstance(outcome, Accepted) for outcome in outcomes), outcomes
    return [outcome.provider_message_id for outcome in outcomes if isinstance(outcome, Accepted)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port  # closed again: connecting to it is refused


# --- the happy paths --------------------------------------------------------------------


async def test_single_send_posts_brevos_shape_and_returns_its_message_id(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    email = outgoing_email(0, headers={"X-Campaign": "welcome", "Message-Id": "<not-ours@x>"})

    outcome = await provider.send(email)

    (request,) = brevo.requests
    assert (request.method, request.path) == ("POST", "/v3/smtp/email")
    assert request.headers["api-key"] == brevo.api_key
    assert request.headers["accept"] == "application/json"
    assert request.headers["content-type"] == "application/json"
    assert request.json == {
        "sender": {"email": "sender@example.com", "name": "Sender"},
        "to": [{"email": "user0@example.com", "name": "User 0"}],
        "subject": "Hello 0",
        "htmlContent": "<p>Hello 0</p>",
        "textContent": "Hello 0",
        "headers": {
            "X-Campaign": "welcome",
            "X-Mailbag-Message-ID": str(email.message_id),
            "Message-Id": email.rfc_message_id,  # ours wins over a caller's header
            "idempotencyKey": str(uuid.uuid5(IDEMPOTENCY_NAMESPACE, email.idempotency_key)),
        },
        "tags": ["test", f"mailbag-{email.message_id}"],  # ours lets reconciliation find it
    }
    (delivery,) = brevo.delivered()
    assert outcome == Accepted(delivery.message_id)
    assert delivery.message_id.endswith("@smtp-relay.mailin.fr>")


async def test_empty_optional_fields_are_left_out(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    email = outgoing_email(0, from_name=None, to_name=None, text="", tags=[])

    assert isinstance(await provider.send(email), Accepted)

    body = brevo.requests[0].json
    assert body["sender"] == {"email": "sender@example.com"}
    assert body["to"] == [{"email": "user0@example.com"}]
    assert "textContent" not in body
    assert body["tags"] == [f"mailbag-{email.message_id}"]  # only our lookup tag


def test_the_idempotency_key_is_a_uuid_fixed_by_message_and_attempt() -> None:
    email = outgoing_email(0)
    again = outgoing_email(0, message_id=email.message_id, date=T0 + timedelta(minutes=3))
    next_attempt = outgoing_email(0, message_id=email.message_id, attempt=2)

    assert uuid.UUID(brevo_idempotency_key(email))  # Brevo requires a UUID
    assert brevo_idempotency_key(again) == brevo_idempotency_key(email)
    assert brevo_idempotency_key(next_attempt) != brevo_idempotency_key(email)


async def test_batch_goes_through_message_versions_with_ids_in_order(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    batch = emails(3)

    outcomes = await provider.send_batch(batch)

    (request,) = brevo.requests
    assert "to" not in request.json
    assert request.json["sender"] == {"email": "sender@example.com", "name": "Sender"}
    assert request.json["tags"] == ["test"]
    assert request.versions == [
        {
            "to": [{"email": f"user{i}@example.com", "name": f"User {i}"}],
            "subject": f"Hello {i}",
            "htmlContent": f"<p>Hello {i}</p>",
            "textContent": f"Hello {i}",
        }
        for i in range(3)
    ]
    assert accepted_ids(outcomes) == [d.message_id for d in brevo.delivered()]
    assert [d.to_emails for d in brevo.delivered()] == [[e.to_email] for e in batch]


async def test_1500_emails_go_as_1000_and_500_versions(
    brevo: BrevoServer,
) -> None:
    # The test server checks a 1,000-version call against the spec: seconds on a loaded
    # machine, past the fixture's short timeout.
    provider = BrevoProvider(api_key=brevo.api_key, base_url=brevo.url, timeout=30)
    try:
        outcomes = await provider.send_batch(emails(1500))
    finally:
        await provider.aclose()

    assert sorted(len(r.versions) for r in brevo.requests) == [500, 1000]
    ids = accepted_ids(outcomes)
    assert len(set(ids)) == 1500
    by_recipient = {d.to_emails[0]: d.message_id for d in brevo.delivered()}
    assert ids == [by_recipient[f"user{i}@example.com"] for i in range(1500)]


async def test_different_senders_never_share_a_call(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    batch = [
        outgoing_email(0, from_email="a@example.com"),
        outgoing_email(1, from_email="b@example.com"),
        outgoing_email(2, from_email="a@example.com"),
        outgoing_email(3, from_email="b@example.com"),
    ]

    outcomes = await provider.send_batch(batch)

    senders = {r.json["sender"]["email"]: r for r in brevo.requests}
    assert set(senders) == {"a@example.com", "b@example.com"}
    assert [v["to"][0]["email"] for v in senders["a@example.com"].versions] == [
        "user0@example.com",
        "user2@example.com",
    ]
    by_recipient = {d.to_emails[0]: d.message_id for d in brevo.delivered()}
    assert accepted_ids(outcomes) == [by_recipient[e.to_email] for e in batch]


async def test_tags_and_custom_headers_are_per_call_so_they_split_calls_too(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    # Message versions carry neither tags nor headers: only equal ones can share a call.
    batch = [
        outgoing_email(0, tags=["welcome"]),
        outgoing_email(1, tags=["reset"]),
        outgoing_email(2, tags=["welcome"], headers={"X-Campaign": "spring"}),
        outgoing_email(3, tags=["welcome"]),
    ]

    outcomes = await provider.send_batch(batch)

    assert len(accepted_ids(outcomes)) == 4
    seen = {
        d.to_emails[0]: (
            [t for t in d.tags if not t.startswith("mailbag-")],
            d.headers.get("X-Campaign"),
        )
        for d in brevo.delivered()
    }
    assert seen == {
        "user0@example.com": (["welcome"], None),
        "user1@example.com": (["reset"], None),
        "user2@example.com": (["welcome"], "spring"),
        "user3@example.com": (["welcome"], None),
    }
    assert sorted(len(r.versions) for r in brevo.requests) == [0, 0, 2]  # two went single


# --- Brevo answered, and said no --------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "invalid_parameter"),
        (401, "unauthorized"),
        (403, "permission_denied"),
        (422, "unprocessable_entity"),
    ],
)
async def test_permanent_refusals_are_rejected_with_brevos_reason(
    brevo: BrevoServer, provider: BrevoProvider, status: int, code: str
) -> None:
    brevo.fail_next(status, {"code": code, "message": f"refused ({brevo.api_key})"})

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Rejected)
    assert str(status) in outcome.error and code in outcome.error
    assert brevo.api_key not in outcome.error
    assert brevo.delivered() == []


async def test_a_wrong_api_key_is_rejected_and_not_echoed(brevo: BrevoServer) -> None:
    wrong = BrevoProvider(api_key="xkeysib-wrong", base_url=brevo.url, timeout=CLIENT_TIMEOUT)
    try:
        outcome = await wrong.send(outgoing_email(0))
    finally:
        await wrong.aclose()

    assert isinstance(outcome, Rejected)
    assert "unauthorized" in outcome.error and "Key not found" in outcome.error
    assert "xkeysib-wrong" not in outcome.error and "xkeysib-wrong" not in repr(wrong)


async def test_rate_limit_is_throttled_until_brevos_reset(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    brevo.rate_limit_next(reset_seconds=17)

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Throttled)
    assert outcome.retry_after == timedelta(seconds=17)
    assert "too_many_requests" in outcome.error


async def test_rate_limit_without_brevos_header_falls_back_to_retry_after(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    brevo.fail_next(429, headers={"retry-after": "42"})

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Throttled) and outcome.retry_after == timedelta(seconds=42)


async def test_server_error_is_deferred(brevo: BrevoServer, provider: BrevoProvider) -> None:
    brevo.fail_next(500)

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Deferred) and "500" in outcome.error
    assert brevo.delivered() == []


async def test_success_without_a_message_id_is_ambiguous(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    brevo.fail_next(201, {"unexpected": True})

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Ambiguous) and outcome.keyed


async def test_connection_refused_is_deferred() -> None:
    nowhere = BrevoProvider(
        api_key="k", base_url=f"http://127.0.0.1:{free_port()}", timeout=CLIENT_TIMEOUT
    )
    try:
        single = await nowhere.send(outgoing_email(0))
        batch = await nowhere.send_batch(emails(2))
    finally:
        await nowhere.aclose()

    assert isinstance(single, Deferred) and "ConnectError" in single.error
    assert all(isinstance(outcome, Deferred) for outcome in batch)


# --- the request left, and no answer came back ---------------------------------------------


async def test_accepted_then_timeout_is_ambiguous_and_keyed(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    brevo.hang_after_accept()

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Ambiguous) and outcome.keyed
    assert "ReadTimeout" in outcome.error
    assert len(brevo.delivered()) == 1  # Brevo did take it


async def test_accepted_then_dropped_connection_is_ambiguous_and_keyed(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    brevo.drop_after_accept()

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Ambiguous) and outcome.keyed
    assert "RemoteProtocolError" in outcome.error
    assert len(brevo.delivered()) == 1


async def test_an_ambiguous_single_send_is_retried_under_the_key_window() -> None:
    outcome = Ambiguous("ReadTimeout", keyed=True)
    window = BrevoProvider(api_key=None).idempotency_window
    assert window == timedelta(minutes=15)  # Brevo's changelog (its guide says 30: the shorter)

    decision = decide(
        outcome,
        Attempt(number=1, max_attempts=5, claimed_at=T0, ambiguous_since=None),
        now=T0 + timedelta(seconds=31),
        policy=RetryPolicy(),
        key_window=window,
    )

    assert decision.action is Action.RETRY and decision.keep_attempt
    assert decision.next_attempt_at is not None
    assert decision.next_attempt_at < T0 + window  # still inside Brevo's memory of the key


def test_a_keyed_retry_stops_where_brevos_15_minute_key_would_be_forgotten() -> None:
    """Brevo's changelog gives its idempotencyKey 15 minutes: 13 minutes after an ambiguous
    send (inside a 30-minute window, outside the 15-minute one) a resend under the same key
    could be sent twice, so the message is `unknown` instead."""
    window = BrevoProvider(api_key=None).idempotency_window
    assert window is not None
    ambiguous = Ambiguous("ReadTimeout", keyed=True)
    attempt = Attempt(number=1, max_attempts=5, claimed_at=T0, ambiguous_since=T0)

    def at(minutes: int) -> Action:
        now = T0 + timedelta(minutes=minutes)
        return decide(ambiguous, attempt, now=now, policy=RetryPolicy(), key_window=window).action

    assert at(5) is Action.RETRY
    assert at(13) is Action.MARK_UNKNOWN


async def test_resending_after_a_timeout_reuses_the_key_and_delivers_once_replay_mode() -> None:
    """A server that replays the first answer for a known key (what the decision above
    counts on): the resend is Accepted with the first message id, and nothing is sent twice."""
    with BrevoServer(duplicate_key="replay") as brevo:
        provider = BrevoProvider(api_key=brevo.api_key, base_url=brevo.url, timeout=CLIENT_TIMEOUT)
        try:
            email = outgoing_email(0)
            brevo.hang_after_accept()
            first = await provider.send(email)
            second = await provider.send(email)
        finally:
            await provider.aclose()

        assert isinstance(first, Ambiguous) and first.keyed
        (delivery,) = brevo.delivered()
        assert second == Accepted(delivery.message_id)
        keys = [r.json["headers"]["idempotencyKey"] for r in brevo.send_requests()]
        assert keys == [brevo_idempotency_key(email)] * 2


async def test_resending_after_a_timeout_to_brevos_duplicate_error_is_unknown(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    """Brevo documents answering a known key with 400 duplicate_parameter. That is not a
    rejection of the email (it may well have been sent): it must end `unknown`."""
    email = outgoing_email(0)
    brevo.hang_after_accept()
    first = await provider.send(email)

    second = await provider.send(email)

    assert isinstance(first, Ambiguous) and first.keyed
    assert isinstance(second, Ambiguous) and not second.keyed
    assert "duplicate_parameter" in second.error
    assert len(brevo.delivered()) == 1
    decision = decide(
        second,
        Attempt(number=1, max_attempts=5, claimed_at=T0, ambiguous_since=T0),
        now=T0 + timedelta(minutes=1),
        policy=RetryPolicy(),
        key_window=provider.idempotency_window,
    )
    assert decision.action is Action.MARK_UNKNOWN


async def test_accepted_then_timeout_on_a_batch_is_ambiguous_and_never_keyed(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    brevo.hang_after_accept()

    outcomes = await provider.send_batch(emails(3))

    assert len(outcomes) == 3
    assert all(isinstance(o, Ambiguous) and not o.keyed for o in outcomes), outcomes
    assert len(brevo.delivered()) == 3


# --- one bad email in a batch ------------------------------------------------------------


async def test_a_batch_refused_for_one_recipient_falls_back_to_single_sends(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    brevo.reject_recipient("user2@example.com")
    batch = emails(4)

    outcomes = await provider.send_batch(batch)

    assert [type(o) for o in outcomes] == [Accepted, Accepted, Rejected, Accepted]
    rejected = outcomes[2]
    assert isinstance(rejected, Rejected) and "user2@example.com" in rejected.error
    assert sorted(d.to_emails[0] for d in brevo.delivered()) == [
        "user0@example.com",
        "user1@example.com",
        "user3@example.com",
    ]
    batch_call, *singles = brevo.send_requests()
    assert len(batch_call.versions) == 4 and len(singles) == 4
    assert all("idempotencyKey" in r.json["headers"] for r in singles)


# --- switched off ------------------------------------------------------------------------


async def test_no_api_key_is_disabled_without_any_request(brevo: BrevoServer) -> None:
    keyless = BrevoProvider(api_key=None, base_url=brevo.url)
    try:
        single = await keyless.send(outgoing_email(0))
        batch = await keyless.send_batch(emails(2))
    finally:
        await keyless.aclose()

    assert isinstance(single, Disabled)
    assert all(isinstance(outcome, Disabled) for outcome in batch) and len(batch) == 2
    assert brevo.requests == []


async def test_the_registry_builds_it_from_settings(brevo: BrevoServer) -> None:
    settings = Settings.model_validate(
        {"brevo_api_key": brevo.api_key, "brevo_base_url": brevo.url, "concurrency": 4}
    )
    assert isinstance(settings.brevo_api_key, SecretStr)
    built = create("brevo", settings)
    try:
        assert isinstance(built, BrevoProvider) and isinstance(built, Provider)
        assert (built.name, built.max_batch_size) == ("brevo", 1000)
        assert isinstance(await built.send(outgoing_email(0)), Accepted)
    finally:
        await built.aclose()


# --- reading back ------------------------------------------------------------------------


async def test_lookup_finds_a_sent_email_by_its_message_id(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    sent = await provider.send(outgoing_email(7, tags=["welcome"]))
    assert isinstance(sent, Accepted)

    (record,) = await provider.lookup(message_id=sent.provider_message_id)
    missing = await provider.lookup(message_id="<nothing@smtp-relay.mailin.fr>")
    by_tag = await provider.lookup(email="user7@example.com", tag="welcome")
    other_tag = await provider.lookup(email="user7@example.com", tag="other")

    assert record["messageId"] == sent.provider_message_id
    assert (record["email"], record["subject"], record["tags"][0]) == (
        "user7@example.com",
        "Hello 7",
        "welcome",
    )
    assert record["uuid"] and record["date"]
    assert missing == [] and other_tag == []
    assert [r["messageId"] for r in by_tag] == [sent.provider_message_id]
    lookup_request = brevo.requests[1]
    assert (lookup_request.method, lookup_request.path) == ("GET", "/v3/smtp/emails")
    assert lookup_request.query["messageId"] == [sent.provider_message_id]


async def test_lookup_failure_raises_a_clear_error(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    brevo.fail_next(500, endpoint=Endpoint.LOOKUP)

    with pytest.raises(BrevoLookupError, match="500") as raised:
        await provider.lookup(message_id="<x@smtp-relay.mailin.fr>")

    assert raised.value.status == 500
    assert brevo.api_key not in str(raised.value)


# --- everything one message can carry ---------------------------------------------------


PDF = tiny_pdf()
PNG = tiny_png()
BCC = "hidden@example.org"


def full_email(i: int = 0, *, logo_cid: str = "logo", **overrides: Any) -> OutgoingEmail:
    """Two To (one on an IDN domain), a Cc, a Bcc, a Reply-To, a PDF, an inline PNG
    referenced from the HTML, and an unsubscribe link."""
    fields: dict[str, Any] = {
        "recipients": Recipients(
            to=(Address(f"user{i}@example.com", "Ana Añez"), Address("zoe@bücher.example")),
            cc=(Address("copy@example.net", "Copy"),),
            bcc=(Address(BCC, "Hidden"),),
        ),
        "reply_to": (Address("support@example.com", "Support"),),
        "html": f'<p>Hello {i}</p><img src="cid:{logo_cid}" alt="logo">',
        "attachments": (
            Attachment("invoice.pdf", "application/pdf", PDF),
            Attachment("logo.png", "image/png", PNG, content_id=logo_cid),
        ),
        "unsubscribe_url": "https://example.com/unsubscribe?u=1",
        "unsubscribe_mailto": "unsubscribe@example.com",
        "headers": {"X-Campaign": "spring"},
    }
    fields.update(overrides)
    email: OutgoingEmail = outgoing_email(i, **fields)
    return email


async def test_a_message_with_every_part_arrives_in_brevos_own_fields(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    email = full_email()

    outcome = await provider.send(email)

    (request,) = brevo.send_requests()
    body = request.json
    assert body["to"] == [
        {"email": "user0@example.com", "name": "Ana Añez"},
        {"email": "zoe@xn--bcher-kva.example"},  # the ASCII (IDNA) form Brevo's schema takes
    ]
    assert body["cc"] == [{"email": "copy@example.net", "name": "Copy"}]
    assert body["bcc"] == [{"email": BCC, "name": "Hidden"}]
    assert body["replyTo"] == {"email": "support@example.com", "name": "Support"}
    assert body["headers"]["List-Unsubscribe"] == (
        "<https://example.com/unsubscribe?u=1>, <mailto:unsubscribe@example.com>"
    )
    assert body["headers"]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert body["headers"]["X-Campaign"] == "spring"
    # The Bcc is in `bcc` and nowhere else: no header names or carries it.
    assert json.dumps(body).count(BCC) == 1
    assert not any(name.lower() == "bcc" for name in body["headers"])
    assert BCC not in json.dumps(body["headers"])
    # The PDF's bytes arrive as they left.
    (delivery,) = brevo.delivered()
    assert outcome == Accepted(delivery.message_id)
    assert delivery.attachment("invoice.pdf") == PDF
    assert base64.b64decode(body["attachment"][0]["content"], validate=True) == PDF
    # The inline image goes under the name its cid: reference uses (the content id gains
    # the file's extension, which Brevo requires), and the HTML refers to that name.
    assert cid_references(body["htmlContent"]) == {"logo.png"}
    assert delivery.attachment("logo.png") == PNG
    assert [a["name"] for a in body["attachment"]] == ["invoice.pdf", "logo.png"]
    assert delivery.recipient_emails == [
        "user0@example.com",
        "zoe@xn--bcher-kva.example",
        "copy@example.net",
        BCC,
    ]


async def test_an_inline_content_id_with_an_extension_is_its_name_and_the_html_is_untouched(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    email = full_email(logo_cid="brand.png")

    assert isinstance(await provider.send(email), Accepted)

    body = brevo.send_requests()[0].json
    assert body["htmlContent"] == email.html
    assert brevo.delivered()[0].attachment("brand.png") == PNG


async def test_every_cid_reference_to_a_renamed_image_follows_it_and_others_are_left(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    html = (
        '<img src="cid:logo"><div style="background:url(cid:logo)"></div>'
        '<img src="cid:logo-big.png"><img src="CID:logo">'
    )
    email = full_email(
        html=html,
        attachments=(
            Attachment("logo.png", "image/png", PNG, content_id="logo"),
            Attachment("big.png", "image/png", PNG, content_id="logo-big.png"),
        ),
    )

    assert isinstance(await provider.send(email), Accepted)

    sent = brevo.send_requests()[0].json["htmlContent"]
    assert sent == (
        '<img src="cid:logo.png"><div style="background:url(cid:logo.png)"></div>'
        '<img src="cid:logo-big.png"><img src="cid:logo.png">'
    )


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (
            {"reply_to": (Address("a@example.com"), Address("b@example.com"))},
            "2 Reply-To addresses",
        ),
        (
            {"attachments": (Attachment("setup.exe", "application/octet-stream", b"MZ"),)},
            "'setup.exe'",
        ),
        (
            {
                "attachments": (
                    Attachment("logo.png", "image/png", PNG, content_id="logo"),
                    Attachment("logo.png", "image/png", PNG),
                )
            },
            "named 'logo.png'",
        ),
    ],
    ids=["several-reply-to", "extension-brevo-refuses", "inline-name-taken"],
)
async def test_what_brevo_cannot_carry_is_rejected_with_the_reason_and_never_sent(
    brevo: BrevoServer, provider: BrevoProvider, overrides: dict[str, Any], reason: str
) -> None:
    outcome = await provider.send(full_email(**overrides))

    assert isinstance(outcome, Rejected)
    assert "the brevo provider cannot send" in outcome.error and reason in outcome.error
    assert brevo.requests == []


async def test_a_text_only_email_sends_no_html(brevo: BrevoServer, provider: BrevoProvider) -> None:
    assert isinstance(await provider.send(outgoing_email(0, html="")), Accepted)

    body = brevo.send_requests()[0].json
    assert "htmlContent" not in body and body["textContent"] == "Hello 0"


async def test_a_mixed_batch_sends_plain_ones_as_versions_and_the_rest_alone_in_order(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    batch = [
        outgoing_email(0),
        outgoing_email(1),
        outgoing_email(2, attachments=(Attachment("invoice.pdf", "application/pdf", PDF),)),
        outgoing_email(
            3,
            recipients=Recipients(
                to=(Address("user3@example.com"), Address("also3@example.com")),
            ),
        ),
        outgoing_email(
            4,
            recipients=Recipients(
                to=(Address("user4@example.com"),), cc=(Address("cc4@example.com"),)
            ),
        ),
        outgoing_email(5, reply_to=(Address("help@example.com"),)),
        outgoing_email(
            6,
            recipients=Recipients(
                to=(Address("user6@example.com"),), bcc=(Address("bcc6@example.com"),)
            ),
        ),
        outgoing_email(7),
    ]

    outcomes = await provider.send_batch(batch)

    requests = brevo.send_requests()
    (batch_call,) = [r for r in requests if r.versions]
    singles = {r.json["to"][0]["email"]: r.json for r in requests if not r.versions}
    # Several To fit a version; attachments, Cc, Bcc and Reply-To go alone.
    assert [[to["email"] for to in v["to"]] for v in batch_call.versions] == [
        ["user0@example.com"],
        ["user1@example.com"],
        ["user3@example.com", "also3@example.com"],
        ["user7@example.com"],
    ]
    assert set(singles) == {
        "user2@example.com",
        "user4@example.com",
        "user5@example.com",
        "user6@example.com",
    }
    assert base64.b64decode(singles["user2@example.com"]["attachment"][0]["content"]) == PDF
    assert singles["user4@example.com"]["cc"] == [{"email": "cc4@example.com"}]
    assert singles["user5@example.com"]["replyTo"] == {"email": "help@example.com"}
    assert singles["user6@example.com"]["bcc"] == [{"email": "bcc6@example.com"}]
    assert all("idempotencyKey" in single["headers"] for single in singles.values())
    # One outcome per email, in input order: each is the id of that email's own delivery.
    by_recipient = {d.to_emails[0]: d.message_id for d in brevo.delivered()}
    assert accepted_ids(outcomes) == [by_recipient[e.to_email] for e in batch]


async def test_list_unsubscribe_rides_the_call_so_only_equal_ones_share_one(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    shared = "https://example.com/unsubscribe/list-7"
    batch = [
        outgoing_email(0, unsubscribe_url=shared),
        outgoing_email(1, unsubscribe_url="https://example.com/unsubscribe/u1"),
        outgoing_email(2, unsubscribe_url=shared),
    ]

    outcomes = await provider.send_batch(batch)

    assert len(accepted_ids(outcomes)) == 3
    headers = {d.to_emails[0]: d.headers for d in brevo.delivered()}
    for i, url in enumerate([shared, "https://example.com/unsubscribe/u1", shared]):
        assert headers[f"user{i}@example.com"]["List-Unsubscribe"] == f"<{url}>"
        assert headers[f"user{i}@example.com"]["List-Unsubscribe-Post"] == (
            "List-Unsubscribe=One-Click"
        )
    assert sorted(len(r.versions) for r in brevo.send_requests()) == [0, 2]


async def test_text_only_and_html_emails_never_share_a_call(
    brevo: BrevoServer, provider: BrevoProvider
) -> None:
    # A version without htmlContent would inherit the call's: another email's body.
    batch = [
        outgoing_email(0),
        outgoing_email(1, html=""),
        outgoing_email(2),
        outgoing_email(3, html=""),
    ]

    outcomes = await provider.send_batch(batch)

    assert len(accepted_ids(outcomes)) == 4
    bodies = {d.to_emails[0]: (d.html, d.text) for d in brevo.delivered()}
    assert bodies == {
        "user0@example.com": ("<p>Hello 0</p>", "Hello 0"),
        "user1@example.com": (None, "Hello 1"),
        "user2@example.com": ("<p>Hello 2</p>", "Hello 2"),
        "user3@example.com": (None, "Hello 3"),
    }
    assert sorted(len(r.versions) for r in brevo.send_requests()) == [2, 2]


# Text as emails carry it: any code point but lone surrogates (no encoding carries them).
_TEXT = st.text(st.characters(exclude_categories=["Cs"]))


@given(st.dictionaries(_TEXT, st.lists(st.dictionaries(_TEXT, _TEXT), max_size=3), max_size=4))
def test_a_request_body_is_the_json_httpx_would_have_written(payload: dict[str, Any]) -> None:
    # orjson encodes it, for speed; the bytes must be exactly the standard encoder's.
    expected = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    assert encode_json(payload) == expected.encode()


async def test_a_call_never_holds_more_than_2000_recipients(brevo: BrevoServer) -> None:
    # Not the fixture's provider: its 0.5 s timeout is for the "accepted, then silence"
    # cases, and the fake takes about 0.1 s to check and record this 2,000-recipient call
    # alone (up to 0.3 s seen with the cores busy), so on a loaded machine the answer could
    # come after the timeout, and the test failed now and then as Ambiguous outcomes.
    provider = BrevoProvider(api_key=brevo.api_key, base_url=brevo.url, max_connections=8)
    batch = [
        outgoing_email(
            i,
            recipients=Recipients(to=tuple(Address(f"user{i}.{j}@example.com") for j in range(50))),
        )
        for i in range(41)  # 2050 recipients
    ]

    try:
        outcomes = await provider.send_batch(batch)
    finally:
        await provider.aclose()

    per_call = [
        sum(len(v["to"]) for v in r.versions) if r.versions else len(r.json["to"])
        for r in brevo.send_requests()
    ]
    assert sorted(per_call) == [50, 2000]  # 40 versions, then the last email by itself
    by_recipient = {d.to_emails[0]: d.message_id for d in brevo.delivered()}
    assert accepted_ids(outcomes) == [by_recipient[e.to_email] for e in batch]


@pytest.mark.parametrize(
    ("attachment", "message"),
    [
        ({"content": "not base64!", "name": "a.pdf"}, "not valid base64"),
        ({"content": "QUJD\nREVG", "name": "a.pdf"}, "not valid base64"),
        ({"content": "QUJD"}, "name is required"),
        ({"content": "QUJD", "name": "a.exe"}, "extension"),
        ({"name": "a.pdf"}, "url or content"),
        ({"url": "file:///etc/passwd", "name": "a.pdf"}, "absolute URL"),
    ],
)
def test_the_fake_refuses_attachments_as_brevo_documents(
    brevo: BrevoServer, attachment: dict[str, str], message: str
) -> None:
    body = {
        "sender": {"email": "sender@example.com"},
        "to": [{"email": "user@example.com"}],
        "subject": "s",
        "htmlContent": "<p>h</p>",
        "attachment": [attachment],
    }

    answer = httpx.post(brevo.url + SEND_PATH, json=body, headers={"api-key": brevo.api_key})

    assert answer.status_code == 400 and message in answer.json()["message"]
    assert brevo.delivered() == []


@pytest.mark.parametrize(
    ("bcc", "message"),
    [
        ({"email": "bcc@example.com"}, "at most 99 recipients"),  # 50 + 49 + 1
        ({"email": "b@example.com", "name": "x" * 71}, "longer than 70 characters"),
    ],
)
def test_the_fake_counts_cc_and_bcc_in_a_version_and_limits_names(
    brevo: BrevoServer, bcc: dict[str, str], message: str
) -> None:
    body = {
        "sender": {"email": "sender@example.com"},
        "subject": "s",
        "htmlContent": "<p>h</p>",
        "messageVersions": [
            {
                "to": [{"email": f"to{i}@example.com"} for i in range(50)],
                "cc": [
                    {"email": f"cc{i}@example.com"} for i in range(49 if "name" not in bcc else 1)
                ],
                "bcc": [bcc],
            }
        ],
    }

    answer = httpx.post(brevo.url + SEND_PATH, json=body, headers={"api-key": brevo.api_key})

    assert answer.status_code == 400 and message in answer.json()["message"]
