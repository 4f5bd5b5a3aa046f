"""The SendGrid provider against a real HTTP server that behaves like SendGrid's Mail Send API
(tests/sendgrid_server.py), every request checked against tests/data/specs/sendgrid.yaml."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
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
    Throttled,
    decide,
)
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.states import Action
from mailbag.providers import Provider, capabilities, create
from mailbag.providers.sendgrid import (
    FROM_REFUSED,
    MAX_CATEGORIES,
    RESPONSE_TABLE,
    SendGridProvider,
)
from mailbag.settings import Settings
from sendgrid_server import SEND_PATH, SendGridServer, error_body
from servers import free_port

from helpers import T0, outgoing_email, tiny_pdf, tiny_png

CLIENT_TIMEOUT = 0.5  # seconds: short, so the "accepted, then silence" cases stay quick
PDF, PNG = tiny_pdf(), tiny_png()
BCC = "hidden@example.org"


@pytest.fixture
def sendgrid() -> Iterator[SendGridServer]:
    with SendGridServer() as server:
        yield server
        assert server.violations == []  # every request conformed to SendGrid's spec


@pytest.fixture
async def provider(sendgrid: SendGridServer) -> AsyncIterator[SendGridProvider]:
    client = SendGridProvider(
        api_key=sendgrid.api_key, base_url=sendgrid.url, timeout=CLIENT_TIMEOUT, max_connections=8
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


# --- what a send carries ---------------------------------------------------------------------


async def test_a_send_posts_sendgrids_shape_and_returns_its_x_message_id(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    email = outgoing_email(0, tenant_id="acme", headers={"X-Campaign": "welcome"})

    outcome = await provider.send(email)

    (request,) = sendgrid.requests
    assert (request.method, request.path) == ("POST", SEND_PATH)
    assert request.headers["authorization"] == f"Bearer {sendgrid.api_key}"
    assert request.headers["content-type"] == "application/json"
    assert request.json == {
        "personalizations": [
            {
                "to": [{"email": "user0@example.com", "name": "User 0"}],
                "custom_args": {
                    "mailbag_message_id": str(email.message_id),
                    "mailbag_tenant_id": "acme",
                },
            }
        ],
        "from": {"email": "sender@example.com", "name": "Sender"},
        "subject": "Hello 0",
        "content": [
            {"type": "text/plain", "value": "Hello 0"},  # SendGrid wants text/plain first
            {"type": "text/html", "value": "<p>Hello 0</p>"},
        ],
        "headers": {
            "X-Campaign": "welcome",
            "Message-ID": email.rfc_message_id,
            "X-Mailbag-Message-ID": str(email.message_id),
        },
        "categories": ["test"],
    }
    (delivery,) = sendgrid.delivered()
    assert outcome == Accepted(delivery.message_id)


async def test_a_message_with_every_part_arrives_in_sendgrids_own_fields(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    email = full_email()

    outcome = await provider.send(email)

    (delivery,) = sendgrid.delivered()
    assert outcome == Accepted(delivery.message_id)
    body = delivery.body
    assert delivery.personalization["to"] == [
        {"email": "user0@example.com", "name": "Ana Añez"},
        {"email": "zoe@xn--bcher-kva.example"},  # the ASCII (IDNA) form its schema takes
    ]
    assert delivery.personalization["cc"] == [{"email": "copy@example.net", "name": "Copy"}]
    assert delivery.personalization["bcc"] == [{"email": BCC, "name": "Hidden"}]
    assert body["reply_to"] == {"email": "support@example.com", "name": "Support"}
    assert delivery.headers["List-Unsubscribe"] == "<https://example.com/unsubscribe?u=1>"
    assert delivery.headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert delivery.headers["X-Campaign"] == "spring"
    assert delivery.headers["Message-ID"] == email.rfc_message_id
    # The Bcc is in the personalization's bcc and nowhere else.
    assert json.dumps(body).count(BCC) == 1
    # The PDF as an attachment, the PNG inline under the content id the HTML refers to.
    pdf, pdf_fields = delivery.attachment("invoice.pdf")
    png, png_fields = delivery.attachment("logo.png")
    assert (pdf, pdf_fields["type"], pdf_fields["disposition"]) == (
        PDF,
        "application/pdf",
        "attachment",
    )
    assert "content_id" not in pdf_fields
    assert (png, png_fields["disposition"], png_fields["content_id"]) == (PNG, "inline", "logo")
    assert cid_references(delivery.content("text/html") or "") == {"logo"}


async def test_several_reply_to_addresses_go_as_its_reply_to_list(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    email = outgoing_email(0, reply_to=(Address("a@example.com", "A"), Address("b@example.com")))

    assert isinstance(await provider.send(email), Accepted)

    body = sendgrid.delivered()[0].body
    assert "reply_to" not in body
    assert body["reply_to_list"] == [
        {"email": "a@example.com", "name": "A"},
        {"email": "b@example.com"},
    ]


async def test_a_recipients_name_with_a_comma_is_quoted_and_the_senders_is_not(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    # SendGrid misquotes such a name in a personalization (sendgrid-python#291).
    email = outgoing_email(0, from_name="Acme, Inc.", to_name='Doe; "Jo"')

    assert isinstance(await provider.send(email), Accepted)

    delivery = sendgrid.delivered()[0]
    assert delivery.personalization["to"][0]["name"] == r'"Doe; \"Jo\""'
    assert delivery.body["from"]["name"] == "Acme, Inc."


async def test_an_address_named_twice_is_sent_to_once(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    email = outgoing_email(
        0,
        recipients=Recipients(
            to=(Address("a@example.com"),),
            cc=(Address("A@Example.com"), Address("c@example.com")),
            bcc=(Address("a@example.com"),),
        ),
    )

    assert isinstance(await provider.send(email), Accepted)

    assert sendgrid.delivered()[0].recipient_emails == ["a@example.com", "c@example.com"]


async def test_the_first_ten_tags_are_its_categories(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    tags = [f"tag-{i}" for i in range(12)]

    assert isinstance(await provider.send(outgoing_email(0, tags=tags)), Accepted)

    assert sendgrid.delivered()[0].body["categories"] == tags[:MAX_CATEGORIES]


async def test_a_text_only_email_sends_text_plain_alone(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    assert isinstance(await provider.send(outgoing_email(0, html="", tags=[])), Accepted)

    body = sendgrid.delivered()[0].body
    assert body["content"] == [{"type": "text/plain", "value": "Hello 0"}]
    assert "categories" not in body


async def test_a_batch_is_one_request_per_email_with_outcomes_in_order(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    batch = [outgoing_email(i) for i in range(3)]

    outcomes = await provider.send_batch(batch)

    assert provider.max_batch_size == 1 and len(sendgrid.send_requests()) == 3
    deliveries = sendgrid.delivered()
    assert outcomes == [Accepted(d.message_id) for d in deliveries]
    assert [d.emails("to") for d in deliveries] == [[e.to_email] for e in batch]
    assert [d.custom_args["mailbag_message_id"] for d in deliveries] == [
        str(e.message_id) for e in batch
    ]


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"Reply-To": "<a@example.com>"}, "give reply_to instead"),
        ({"DKIM-Signature": "v=1; a=rsa-sha256"}, "a DKIM-Signature header"),
    ],
    ids=["reply-to-header", "dkim-signature"],
)
async def test_a_header_sendgrid_forbids_is_rejected_with_the_reason_and_never_sent(
    sendgrid: SendGridServer, provider: SendGridProvider, headers: dict[str, str], reason: str
) -> None:
    outcome = await provider.send(outgoing_email(0, headers=headers))

    assert isinstance(outcome, Rejected)
    assert "the sendgrid provider cannot send" in outcome.error and reason in outcome.error
    assert sendgrid.requests == []


def test_it_declares_what_it_cannot_carry_and_that_it_has_no_key_or_batch() -> None:
    declared = capabilities("sendgrid")
    assert declared.utf8_local_part is False  # refused at enqueue
    assert SendGridProvider.idempotency_window is None
    assert SendGridProvider.max_batch_size == 1


# --- SendGrid answered, and said no ---------------------------------------------------------


STATUS_ROWS = [
    (400, Rejected),
    (401, Disabled),
    (403, Disabled),
    (404, Rejected),
    (408, Deferred),
    (413, Rejected),
    (429, Throttled),
    (500, Deferred),
    (503, Deferred),
    (307, Deferred),
    (200, Ambiguous),  # a 2xx that is not SendGrid's 202: no id to hold on to
]


@pytest.mark.parametrize(("status", "expected"), STATUS_ROWS)
async def test_each_status_gets_the_outcome_of_its_row(
    sendgrid: SendGridServer, provider: SendGridProvider, status: int, expected: type
) -> None:
    sendgrid.fail_next(status, error_body(f"refused ({sendgrid.api_key})"))

    outcome = await provider.send(outgoing_email(0))

    assert type(outcome) is expected
    assert sendgrid.api_key not in repr(outcome)
    assert sendgrid.delivered() == []
    if expected is not Ambiguous:
        assert str(status) in repr(outcome) and "refused" in repr(outcome)


def test_every_row_of_the_table_is_met_by_a_status_tested_here() -> None:
    def row_of(status: int) -> int:
        return next(
            i
            for i, (key, _) in enumerate(RESPONSE_TABLE)
            if key == status or (isinstance(key, range) and status in key)
        )

    tested = {row_of(status) for status, _ in STATUS_ROWS} | {row_of(202)}  # 202: above
    keys = [key for key, _ in RESPONSE_TABLE]
    tested.add(keys.index(FROM_REFUSED))  # a 403 about the sender: the test below
    assert tested == set(range(len(RESPONSE_TABLE)))


async def test_a_403_about_the_sender_is_the_messages_rejection_not_the_accounts(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    sendgrid.fail_next(
        403, error_body("The from address does not match a verified Sender Identity", "from")
    )

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Rejected) and "Sender Identity (from)" in outcome.error


async def test_a_wrong_api_key_disables_sending_and_is_not_echoed(
    sendgrid: SendGridServer,
) -> None:
    wrong = SendGridProvider(api_key="SG.wrong", base_url=sendgrid.url, timeout=CLIENT_TIMEOUT)
    try:
        outcome = await wrong.send(outgoing_email(0))
    finally:
        await wrong.aclose()

    assert isinstance(outcome, Disabled) and "401" in outcome.reason
    assert "SG.wrong" not in outcome.reason and "SG.wrong" not in repr(wrong)


async def test_a_rate_limit_is_throttled_for_as_long_as_retry_after_says(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    sendgrid.fail_next(429, error_body("too many requests"), headers={"Retry-After": "42"})

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Throttled) and outcome.retry_after == timedelta(seconds=42)


async def test_a_server_error_is_the_providers_fault(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    sendgrid.fail_next(500, error_body("internal server error"))

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Deferred) and outcome.provider_fault


async def test_a_202_without_an_x_message_id_is_ambiguous(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    sendgrid.fail_next(202, None)

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Ambiguous) and not outcome.keyed
    assert "without a message id" in outcome.error


async def test_a_refused_recipient_is_rejected_with_sendgrids_reason(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    sendgrid.reject_recipient("user0@example.com")

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Rejected)
    assert "user0@example.com" in outcome.error and "personalizations.0.to.0" in outcome.error


async def test_connection_refused_is_deferred() -> None:
    nowhere = SendGridProvider(
        api_key="k", base_url=f"http://127.0.0.1:{free_port()}", timeout=CLIENT_TIMEOUT
    )
    try:
        outcome = await nowhere.send(outgoing_email(0))
    finally:
        await nowhere.aclose()

    assert isinstance(outcome, Deferred) and "ConnectError" in outcome.error


# --- the request left, and no answer came back ----------------------------------------------


async def test_accepted_then_timeout_is_ambiguous_and_ends_unknown(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    sendgrid.hang_after_accept()

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Ambiguous) and "ReadTimeout" in outcome.error
    assert len(sendgrid.delivered()) == 1  # SendGrid did take it
    decision = decide(
        outcome,
        Attempt(number=1, max_attempts=5, claimed_at=T0, ambiguous_since=None),
        now=T0 + timedelta(seconds=1),
        policy=RetryPolicy(),
        key_window=provider.idempotency_window,
    )
    assert decision.action is Action.MARK_UNKNOWN  # no key: never sent again blindly


async def test_accepted_then_dropped_connection_is_ambiguous(
    sendgrid: SendGridServer, provider: SendGridProvider
) -> None:
    sendgrid.drop_after_accept()

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Ambiguous) and "RemoteProtocolError" in outcome.error
    assert len(sendgrid.delivered()) == 1


# --- switched off, and built from settings -------------------------------------------------


async def test_no_api_key_is_disabled_without_any_request(sendgrid: SendGridServer) -> None:
    keyless = SendGridProvider(api_key=None, base_url=sendgrid.url)
    try:
        single = await keyless.send(outgoing_email(0))
        batch = await keyless.send_batch([outgoing_email(1), outgoing_email(2)])
    finally:
        await keyless.aclose()

    assert isinstance(single, Disabled) and "SENDGRID_API_KEY" in single.reason
    assert all(isinstance(outcome, Disabled) for outcome in batch) and len(batch) == 2
    assert sendgrid.requests == []


async def test_the_registry_builds_it_from_settings(sendgrid: SendGridServer) -> None:
    settings = Settings.model_validate(
        {"sendgrid_api_key": sendgrid.api_key, "sendgrid_base_url": sendgrid.url}
    )
    assert isinstance(settings.sendgrid_api_key, SecretStr)
    built = create("sendgrid", settings)
    try:
        assert isinstance(built, SendGridProvider) and isinstance(built, Provider)
        assert isinstance(await built.send(outgoing_email(0)), Accepted)
    finally:
        await built.aclose()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"personalizations": [{"to": [{"email": "a@x.com"}], "cc": [{"email": "A@x.com"}]}]},
            "unique",
        ),
        (
            {
                "content": [
                    {"type": "text/html", "value": "<p>h</p>"},
                    {"type": "text/plain", "value": "h"},
                ]
            },
            "text/plain must come before",
        ),
        (
            {"attachments": [{"content": "QUJD", "filename": "l.png", "disposition": "inline"}]},
            "content_id",
        ),
        ({"attachments": [{"content": "not base64!", "filename": "a.pdf"}]}, "base64"),
        ({"personalizations": [{"to": [{"email": "zoe@bücher.example"}]}]}, "valid address"),
        ({"headers": {"Received": "from x"}}, "not allowed"),
    ],
    ids=[
        "address-twice",
        "html-first",
        "inline-without-cid",
        "not-base64",
        "unicode-domain",
        "forbidden-header",
    ],
)
def test_the_fake_refuses_what_sendgrid_documents_in_prose(
    sendgrid: SendGridServer, change: dict[str, Any], said: str
) -> None:
    body = {
        "personalizations": [{"to": [{"email": "a@example.com"}]}],
        "from": {"email": "s@example.com"},
        "subject": "s",
        "content": [{"type": "text/plain", "value": "h"}],
        **change,
    }

    answer = httpx.post(
        sendgrid.url + SEND_PATH, json=body, headers={"authorization": f"Bearer {sendgrid.api_key}"}
    )

    assert answer.status_code == 400 and said in answer.json()["errors"][0]["message"]
    assert sendgrid.delivered() == []
