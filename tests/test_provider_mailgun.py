"""The Mailgun provider against a real HTTP server that behaves like Mailgun's Messages and
Events APIs (tests/mailgun_server.py), every request checked against
tests/data/specs/mailgun.yaml."""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import dkim as dkimpy
import pytest
from pydantic import SecretStr

from mailbag.compose import OutgoingEmail
from mailbag.domain import dkim
from mailbag.domain.content import Address, Attachment, Recipients
from mailbag.domain.delivery import (
    Accepted,
    Ambiguous,
    Attempt,
    Deferred,
    Disabled,
    Rejected,
    Throttled,
    decide,
)
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.states import Action
from mailbag.providers import Provider, capabilities, create, mailgun
from mailbag.providers.mailgun import RESPONSE_TABLE, MailgunLookupError, MailgunProvider
from mailbag.settings import Settings
from mailgun_server import MailgunServer
from servers import free_port

from helpers import T0, outgoing_email, tiny_pdf, tiny_png

CLIENT_TIMEOUT = 0.5  # seconds: short, so the "accepted, then silence" cases stay quick
PDF, PNG = tiny_pdf(), tiny_png()
BCC = "hidden@example.org"


@pytest.fixture
def mailgun_api() -> Iterator[MailgunServer]:
    with MailgunServer() as server:
        yield server
        assert server.violations == []  # every request conformed to Mailgun's spec


@pytest.fixture
async def provider(mailgun_api: MailgunServer) -> AsyncIterator[MailgunProvider]:
    client = MailgunProvider(
        api_key=mailgun_api.api_key,
        domain=mailgun_api.domain,
        base_url=mailgun_api.url,
        timeout=CLIENT_TIMEOUT,
        max_connections=8,
    )
    yield client
    await client.aclose()


def full_email(**overrides: Any) -> OutgoingEmail:
    """Two To (one on an IDN domain), a Cc, a Bcc, a Reply-To, a PDF, an inline PNG
    referenced from the HTML, an unsubscribe link and a custom header."""
    fields: dict[str, Any] = {
        "recipients": Recipients(
            to=(Address("user0@example.com", "Ana Añez"), Address("zoe@bücher.example")),
            cc=(Address("copy@example.net", "Copy"),),
            bcc=(Address(BCC, "Hidden"),),
        ),
        "reply_to": (Address("support@example.com", "Support"),),
        "html": '<p>Hello</p><img src="cid:logo" alt="logo">',
        "attachments": (
            Attachment("invoice.pdf", "application/pdf", PDF),
            Attachment("logo.png", "image/png", PNG, content_id="logo"),
        ),
        "unsubscribe_url": "https://example.com/unsubscribe?u=1",
        "headers": {"X-Campaign": "spring"},
    }
    fields.update(overrides)
    email: OutgoingEmail = outgoing_email(0, **fields)
    return email


def sent_message(email: OutgoingEmail, created_at: datetime | None = None) -> Any:
    """What reconciliation hands `find_sent`: the stored message (the fields it reads)."""
    return SimpleNamespace(
        id=email.message_id,
        to_address=email.to_email,
        created_at=created_at or datetime.now(UTC),
    )


# --- what a send carries ---------------------------------------------------------------------


async def test_a_send_posts_our_exact_mime_to_messages_mime_and_returns_mailguns_id(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    email = outgoing_email(0, tags=["welcome"])

    outcome = await provider.send(email)

    (request,) = mailgun_api.requests
    assert (request.method, request.path) == ("POST", "/v3/mg.example.com/messages.mime")
    expected_auth = base64.b64encode(f"api:{mailgun_api.api_key}".encode()).decode()
    assert request.headers["authorization"] == f"Basic {expected_auth}"
    assert request.headers["content-type"].startswith("multipart/form-data; boundary=")
    (delivery,) = mailgun_api.delivered()
    assert delivery.mime == email.raw  # byte for byte what mailbag composed
    assert delivery.fields == {
        "to": ["user0@example.com"],
        "v:mailbag-message-id": [str(email.message_id)],
        "o:tag": ["welcome"],
    }
    # Mailgun keeps the MIME's Message-ID: its id is ours.
    assert outcome == Accepted(email.rfc_message_id) == Accepted(delivery.message_id)


async def test_a_message_with_every_part_goes_as_its_mime_with_bcc_in_the_envelope_only(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    email = full_email()

    assert isinstance(await provider.send(email), Accepted)

    (delivery,) = mailgun_api.delivered()
    assert delivery.mime == email.raw
    assert delivery.to == [
        "user0@example.com",
        "zoe@xn--bcher-kva.example",  # the ASCII (IDNA) form
        "copy@example.net",
        BCC,
    ]
    message = delivery.message
    assert BCC not in delivery.mime.decode() and message["Bcc"] is None
    assert message["Cc"] == "Copy <copy@example.net>"
    assert message["Reply-To"] == "Support <support@example.com>"
    assert message["List-Unsubscribe"] == "<https://example.com/unsubscribe?u=1>"
    assert message["X-Campaign"] == "spring"
    parts = {part.get_filename(): part for part in message.walk() if part.get_filename()}
    assert parts["invoice.pdf"].get_content() == PDF
    assert parts["logo.png"].get_content() == PNG
    assert parts["logo.png"]["Content-ID"] == "<logo>"


async def test_only_the_tags_mailgun_takes_go_as_o_tag(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    tags = ["größe", "x" * 129, "a", "b", "c", "d"]  # Mailgun: ASCII, 128 long, 3 a message

    assert isinstance(await provider.send(outgoing_email(0, tags=tags)), Accepted)

    assert mailgun_api.delivered()[0].tags == ["a", "b", "c"]


async def test_a_batch_is_one_request_per_email_with_outcomes_in_order(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    batch = [outgoing_email(i) for i in range(3)]

    outcomes = await provider.send_batch(batch)

    assert provider.max_batch_size == 1 and len(mailgun_api.send_requests()) == 3
    assert outcomes == [Accepted(d.message_id) for d in mailgun_api.delivered()]
    assert [d.to for d in mailgun_api.delivered()] == [[e.to_email] for e in batch]


async def test_a_non_ascii_local_part_is_rejected_and_never_sent(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    outcome = await provider.send(outgoing_email(0, to_email="zoë@example.com"))

    assert isinstance(outcome, Rejected) and "non-ASCII local part" in outcome.error
    assert mailgun_api.requests == []


def test_it_declares_what_it_cannot_carry_and_that_it_has_no_key_or_batch() -> None:
    assert capabilities("mailgun").utf8_local_part is False  # refused at enqueue
    assert MailgunProvider.idempotency_window is None
    assert MailgunProvider.max_batch_size == 1


# --- Mailgun answered, and said no ----------------------------------------------------------

STATUS_ROWS = [
    (400, Rejected),
    (401, Disabled),
    (403, Disabled),
    (404, Disabled),
    (408, Deferred),
    (413, Rejected),
    (429, Throttled),
    (500, Deferred),
    (502, Deferred),
    (307, Deferred),
    (201, Ambiguous),  # a 2xx that is not Mailgun's 200: no id to hold on to
]


@pytest.mark.parametrize(("status", "expected"), STATUS_ROWS)
async def test_each_status_gets_the_outcome_of_its_row(
    mailgun_api: MailgunServer, provider: MailgunProvider, status: int, expected: type
) -> None:
    mailgun_api.fail_next(status, {"message": f"refused ({mailgun_api.api_key})"})

    outcome = await provider.send(outgoing_email(0))

    assert type(outcome) is expected
    assert mailgun_api.api_key not in repr(outcome)
    assert mailgun_api.delivered() == []
    if expected is not Ambiguous:
        assert str(status) in repr(outcome) and "refused" in repr(outcome)


def test_every_row_of_the_table_is_met_by_a_status_tested_here() -> None:
    def row_of(status: int) -> int:
        return next(
            i
            for i, (key, _) in enumerate(RESPONSE_TABLE)
            if key == status or (isinstance(key, range) and status in key)
        )

    tested = {row_of(status) for status, _ in STATUS_ROWS} | {row_of(200)}  # 200: above
    assert tested == set(range(len(RESPONSE_TABLE)))


async def test_a_200_without_an_id_is_ambiguous(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    mailgun_api.fail_next(200, {"message": "Queued. Thank you."})

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Ambiguous) and not outcome.keyed


@pytest.mark.parametrize(
    ("headers", "message", "wait"),
    [
        ({"Retry-After": "42"}, "slow down", 42),
        ({}, "account-requests-per-sec limit exceeded, try again after 120 seconds", 120),
    ],
    ids=["retry-after", "in-its-message"],
)
async def test_a_rate_limit_is_throttled_for_as_long_as_mailgun_says(
    mailgun_api: MailgunServer,
    provider: MailgunProvider,
    headers: dict[str, str],
    message: str,
    wait: int,
) -> None:
    mailgun_api.fail_next(429, {"message": message}, headers=headers)

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Throttled) and outcome.retry_after == timedelta(seconds=wait)


@pytest.mark.parametrize(
    ("key", "domain", "said"),
    [("key-wrong", "mg.example.com", "401"), (None, "other.example.com", "Domain not found")],
    ids=["wrong-key", "other-domain"],
)
async def test_a_wrong_key_or_domain_disables_sending_and_the_key_is_not_echoed(
    mailgun_api: MailgunServer, key: str | None, domain: str, said: str
) -> None:
    wrong = MailgunProvider(
        api_key=key or mailgun_api.api_key,
        domain=domain,
        base_url=mailgun_api.url,
        timeout=CLIENT_TIMEOUT,
    )
    try:
        outcome = await wrong.send(outgoing_email(0))
    finally:
        await wrong.aclose()

    assert isinstance(outcome, Disabled) and said in outcome.reason
    assert mailgun_api.api_key not in outcome.reason and "key-wrong" not in repr(wrong)


async def test_a_refused_recipient_is_rejected_with_mailguns_reason(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    mailgun_api.reject_recipient("user0@example.com")

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Rejected) and "user0@example.com" in outcome.error


async def test_connection_refused_is_deferred() -> None:
    nowhere = MailgunProvider(
        api_key="k",
        domain="mg.example.com",
        base_url=f"http://127.0.0.1:{free_port()}",
        timeout=CLIENT_TIMEOUT,
    )
    try:
        outcome = await nowhere.send(outgoing_email(0))
    finally:
        await nowhere.aclose()

    assert isinstance(outcome, Deferred) and outcome.provider_fault
    assert "ConnectError" in outcome.error


# --- the request left, and no answer came back ----------------------------------------------


async def test_accepted_then_timeout_is_ambiguous_and_ends_unknown(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    mailgun_api.hang_after_accept()

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Ambiguous) and "ReadTimeout" in outcome.error
    assert len(mailgun_api.delivered()) == 1  # Mailgun did take it
    decision = decide(
        outcome,
        Attempt(number=1, max_attempts=5, claimed_at=T0, ambiguous_since=None),
        now=T0 + timedelta(seconds=1),
        policy=RetryPolicy(),
        key_window=provider.idempotency_window,
    )
    assert decision.action is Action.MARK_UNKNOWN  # no key: never sent again blindly


async def test_accepted_then_dropped_connection_is_ambiguous(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    mailgun_api.drop_after_accept()

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Ambiguous) and "RemoteProtocolError" in outcome.error
    assert len(mailgun_api.delivered()) == 1


# --- reading back: the Events API -----------------------------------------------------------


async def test_find_sent_finds_a_sent_message_by_our_message_id_in_mailguns_events(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    email = outgoing_email(0)
    sent = await provider.send(email)
    assert isinstance(sent, Accepted)

    (sighting,) = await provider.find_sent(sent_message(email), email.rfc_message_id)
    nothing = await provider.find_sent(sent_message(outgoing_email(1)), "<nobody@example.com>")

    assert sighting.provider_message_id == sent.provider_message_id
    assert (sighting.message_id, sighting.recipient) == (email.message_id, "user0@example.com")
    assert nothing == []
    lookup = mailgun_api.requests[1]
    assert (lookup.method, lookup.path) == ("GET", "/v3/mg.example.com/events")
    assert lookup.query["message-id"] == email.rfc_message_id.strip("<>")
    assert lookup.query["ascending"] == "yes" and int(lookup.query["begin"]) > 0


async def test_find_sent_reads_every_page_and_only_pages_on_mailguns_own_host(
    mailgun_api: MailgunServer, provider: MailgunProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mailgun, "EVENTS_PAGE_SIZE", 1)
    email = outgoing_email(
        0,
        recipients=Recipients(to=tuple(Address(f"u{i}@example.com") for i in range(3))),
    )
    assert isinstance(await provider.send(email), Accepted)

    found = await provider.find_sent(sent_message(email), email.rfc_message_id)

    assert sorted(s.recipient or "" for s in found) == [f"u{i}@example.com" for i in range(3)]
    pages = [r for r in mailgun_api.requests if r.method == "GET"]
    assert len(pages) == 4  # three records one a page, then the empty page

    record = {"event": "accepted", "message": {"headers": {"message-id": "a@b"}}}
    mailgun_api.fail_next(
        200,
        {"items": [record], "paging": {"next": "http://elsewhere.example/v3/events?page=2"}},
        matches=lambda request: request.method == "GET",
    )
    (elsewhere,) = await provider.find_sent(sent_message(email), email.rfc_message_id)
    assert elsewhere.provider_message_id == "<a@b>" and elsewhere.message_id is None
    assert len([r for r in mailgun_api.requests if r.method == "GET"]) == 5  # no more


async def test_a_rejected_record_is_no_sending(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    message_id = uuid.uuid4()
    record = {
        "event": "rejected",
        "message": {"headers": {"message-id": f"{message_id}@example.com"}},
        "user-variables": {"mailbag-message-id": str(message_id)},
    }
    mailgun_api.fail_next(200, {"items": [record]}, matches=lambda r: r.method == "GET")

    sightings = await provider.find_sent(
        sent_message(outgoing_email(0, message_id=message_id)), f"<{message_id}@example.com>"
    )

    assert sightings == []
    assert len(mailgun_api.requests) == 1  # it had a record: no second look by recipient


async def test_a_failed_lookup_raises_a_clear_error_without_the_key(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    mailgun_api.fail_next(500, {"message": "Internal Server Error"}, matches=lambda r: True)

    with pytest.raises(MailgunLookupError, match="500") as raised:
        await provider.events(begin=T0, message_id="<x@example.com>")

    assert raised.value.status == 500 and mailgun_api.api_key not in str(raised.value)


# --- switched off, and built from settings -------------------------------------------------


@pytest.mark.parametrize(
    ("key", "domain", "missing"),
    [(None, "mg.example.com", "MAILGUN_API_KEY"), ("k", None, "MAILGUN_DOMAIN")],
)
async def test_without_a_key_or_a_domain_it_is_disabled_without_any_request(
    mailgun_api: MailgunServer, key: str | None, domain: str | None, missing: str
) -> None:
    unready = MailgunProvider(api_key=key, domain=domain, base_url=mailgun_api.url)
    try:
        outcome = await unready.send(outgoing_email(0))
        with pytest.raises(MailgunLookupError, match=missing):
            await unready.events(begin=T0)
    finally:
        await unready.aclose()

    assert isinstance(outcome, Disabled) and missing in outcome.reason
    assert mailgun_api.requests == []


async def test_the_registry_builds_it_from_settings_with_the_us_api_by_default(
    mailgun_api: MailgunServer,
) -> None:
    assert Settings().mailgun_base_url == "https://api.mailgun.net"  # EU: api.eu.mailgun.net
    settings = Settings.model_validate(
        {
            "mailgun_api_key": mailgun_api.api_key,
            "mailgun_domain": mailgun_api.domain,
            "mailgun_base_url": mailgun_api.url,
        }
    )
    assert isinstance(settings.mailgun_api_key, SecretStr)
    built = create("mailgun", settings)
    try:
        assert isinstance(built, MailgunProvider) and isinstance(built, Provider)
        assert isinstance(await built.send(outgoing_email(0)), Accepted)
    finally:
        await built.aclose()


async def test_a_signed_email_arrives_at_mailgun_as_mime_whose_signature_verifies(
    mailgun_api: MailgunServer, provider: MailgunProvider
) -> None:
    pair = dkim.generate(dkim.Algorithm.ED25519)
    key = dkim.SigningKey("example.com", "s1", pair.algorithm, pair.private)
    sent = full_email(from_email="billing@example.com", dkim=key)

    assert isinstance(await provider.send(sent), Accepted)
    (delivery,) = mailgun_api.delivered()
    assert delivery.mime.startswith(b"DKIM-Signature: ") and delivery.mime == sent.raw
    assert dkimpy.verify(delivery.mime, dnsfunc=lambda name, timeout=5: pair.record.encode())
