"""The Postmark provider against a real HTTP server that behaves like Postmark's API
(tests/postmark_server.py), every request checked against tests/data/specs/postmark.yaml."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import SecretStr

from mailbag.compose import OutgoingEmail
from mailbag.domain.content import Address, Attachment, Recipients
from mailbag.domain.delivery import (
    Accepted,
    Ambiguous,
    Deferred,
    Disabled,
    Rejected,
    SendOutcome,
    Throttled,
)
from mailbag.providers import capabilities, create
from mailbag.providers.postmark import (
    ERROR_CODES,
    MAX_BATCH,
    METADATA_KEY,
    PostmarkLookupError,
    PostmarkProvider,
)
from mailbag.settings import Settings
from postmark_server import PostmarkServer

from helpers import outgoing_email, tiny_pdf, tiny_png

CLIENT_TIMEOUT = 0.5  # seconds: short, so the "accepted, then silence" cases stay quick


@pytest.fixture
def postmark() -> Iterator[PostmarkServer]:
    with PostmarkServer() as server:
        yield server
        assert server.violations == []  # every request conformed to the spec


@pytest.fixture
async def provider(postmark: PostmarkServer) -> AsyncIterator[PostmarkProvider]:
    client = PostmarkProvider(
        api_key=postmark.token, base_url=postmark.url, timeout=CLIENT_TIMEOUT, max_connections=8
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


def everything(i: int = 0) -> OutgoingEmail:
    """An email with every part Postmark carries."""
    return outgoing_email(
        i,
        recipients=Recipients(
            to=(Address("ann@example.com", "Ann, Esq."), Address("bob@bücher.example")),
            cc=(Address("cat@example.com", "Cat"),),
            bcc=(Address("dan@example.com"),),
        ),
        reply_to=(Address("help@example.com", "Help Desk"), Address("also@example.com")),
        html='<p>Hi <img src="cid:logo"></p>',
        attachments=(
            Attachment("invoice.pdf", "application/pdf", tiny_pdf()),
            Attachment("logo.png", "image/png", tiny_png(), content_id="logo"),
        ),
        headers={"X-Campaign": "welcome", "Message-ID": "<not-ours@x>"},
        unsubscribe_url="https://example.com/u/1",
        tags=["billing", "monthly"],
    )


# --- the happy paths --------------------------------------------------------------------


async def test_a_single_send_posts_postmarks_shape_and_returns_its_message_id(
    postmark: PostmarkServer, provider: PostmarkProvider
) -> None:
    email = outgoing_email(0, headers={"X-Campaign": "welcome"})

    outcome = await provider.send(email)

    (request,) = postmark.requests
    assert (request.method, request.path) == ("POST", "/email")
    assert request.headers["x-postmark-server-token"] == postmark.token
    assert request.headers["accept"] == "application/json"
    assert request.json == {
        "From": "Sender <sender@example.com>",
        "To": "User 0 <user0@example.com>",
        "Subject": "Hello 0",
        "HtmlBody": "<p>Hello 0</p>",
        "TextBody": "Hello 0",
        "Headers": [
            {"Name": "X-Campaign", "Value": "welcome"},
            {"Name": "X-Mailbag-Message-ID", "Value": str(email.message_id)},
            {"Name": "Message-ID", "Value": email.rfc_message_id},
        ],
        "Tag": "test",
        "Metadata": {METADATA_KEY: str(email.message_id)},
        "MessageStream": "outbound",
    }
    (sent,) = postmark.sent()
    assert outcome == Accepted(sent.message_id)


async def test_every_part_of_an_email_travels_in_its_postmark_field(
    postmark: PostmarkServer, provider: PostmarkProvider
) -> None:
    email = everything()

    assert isinstance(await provider.send(email), Accepted)

    (sent,) = postmark.sent()
    body = sent.request
    assert body["To"] == '"Ann, Esq." <ann@example.com>, bob@xn--bcher-kva.example'
    assert body["Cc"] == "Cat <cat@example.com>"
    assert body["Bcc"] == "dan@example.com"  # its own field: envelope only, no header
    assert body["ReplyTo"] == "Help Desk <help@example.com>, also@example.com"
    assert (sent.to, sent.cc, sent.bcc) == (
        ["ann@example.com", "bob@xn--bcher-kva.example"],
        ["cat@example.com"],
        ["dan@example.com"],
    )
    assert body["HtmlBody"] == '<p>Hi <img src="cid:logo"></p>'  # the reference unchanged
    pdf, pdf_fields = sent.attachment("invoice.pdf")
    png, png_fields = sent.attachment("logo.png")
    assert (pdf, png) == (tiny_pdf(), tiny_png())
    assert "ContentID" not in pdf_fields
    assert png_fields["ContentID"] == "cid:logo" and png_fields["ContentType"] == "image/png"
    assert sent.headers["Message-ID"] == email.rfc_message_id  # ours wins over the caller's
    assert sent.headers["List-Unsubscribe"] == "<https://example.com/u/1>"
    assert sent.headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert sent.headers["X-Campaign"] == "welcome"
    assert body["Tag"] == "billing"  # Postmark takes one tag: the first
    assert sent.metadata == {METADATA_KEY: str(email.message_id)}


async def test_the_message_stream_comes_from_its_setting() -> None:
    settings = Settings(postmark_api_key=SecretStr("token"), postmark_message_stream="billing")
    with PostmarkServer(token="token") as postmark:
        provider = PostmarkProvider.from_settings(
            settings.model_copy(update={"postmark_base_url": postmark.url})
        )
        try:
            assert isinstance(await provider.send(outgoing_email(0)), Accepted)
        finally:
            await provider.aclose()
        assert postmark.sent()[0].stream == "billing"
        assert postmark.violations == []


async def test_a_batch_is_one_call_with_one_result_per_email_in_order(
    postmark: PostmarkServer, provider: PostmarkProvider
) -> None:
    batch = [everything(0), *emails(2)]

    outcomes = await provider.send_batch(batch)

    (request,) = postmark.requests
    assert request.path == "/email/batch" and len(request.json) == 3
    assert request.json[0]["Cc"] == "Cat <cat@example.com>"  # a batch item is a full message
    assert accepted_ids(outcomes) == [sent.message_id for sent in postmark.sent()]
    assert [s.metadata[METADATA_KEY] for s in postmark.sent()] == [str(e.message_id) for e in batch]


async def test_more_than_500_emails_go_in_calls_of_at_most_500(
    postmark: PostmarkServer,
) -> None:
    batch = emails(MAX_BATCH + 2)
    # The test server checks a 500-email call against the spec: seconds on a loaded
    # machine, past the fixture's short timeout.
    provider = PostmarkProvider(api_key=postmark.token, base_url=postmark.url, timeout=30)
    try:
        outcomes = await provider.send_batch(batch)
    finally:
        await provider.aclose()

    sizes = sorted(len(r.json) for r in postmark.requests)
    assert sizes == [2, MAX_BATCH]
    by_metadata = {s.metadata[METADATA_KEY]: s.message_id for s in postmark.sent()}
    batch_ids = [by_metadata[str(e.message_id)] for e in batch]
    assert accepted_ids(outcomes) == batch_ids and len(set(batch_ids)) == MAX_BATCH + 2


async def test_one_refused_email_in_a_batch_fails_alone(
    postmark: PostmarkServer, provider: PostmarkProvider
) -> None:
    postmark.deactivate("user1@example.com")

    outcomes = await provider.send_batch(emails(3))

    assert isinstance(outcomes[0], Accepted) and isinstance(outcomes[2], Accepted)
    assert isinstance(outcomes[1], Rejected)
    assert "ErrorCode 406" in outcomes[1].error and "user1@example.com" in outcomes[1].error
    assert len(postmark.sent()) == 2


async def test_an_email_postmark_cannot_carry_is_refused_and_the_rest_go(
    postmark: PostmarkServer, provider: PostmarkProvider
) -> None:
    batch = [*emails(2), outgoing_email(9, to_email="zoë@example.com")]

    outcomes = await provider.send_batch(batch)

    assert accepted_ids(outcomes[:2])
    assert isinstance(outcomes[2], Rejected) and "non-ASCII local part" in outcomes[2].error
    assert len(postmark.sent()) == 2


# --- every row of the tables ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (401, {"ErrorCode": 10, "Message": "Bad or missing Server API token"}, Disabled),
        (422, {"ErrorCode": 300, "Message": "Invalid 'To' address"}, Rejected),
        (422, {"ErrorCode": 406, "Message": "inactive"}, Rejected),
        (422, {"ErrorCode": 411, "Message": "Forbidden attachment type"}, Rejected),
        (422, {"ErrorCode": 405, "Message": "Not allowed to send"}, Disabled),
        (422, {"ErrorCode": 412, "Message": "Account is pending"}, Disabled),
        (422, {"ErrorCode": 413, "Message": "Account may not send"}, Disabled),
        (422, {"ErrorCode": 100, "Message": "Maintenance"}, Deferred),
        (422, {"ErrorCode": 429, "Message": "Rate limit exceeded"}, Throttled),
        (422, {"ErrorCode": 9999, "Message": "a code nobody documented"}, Rejected),
        (200, {"ErrorCode": 406, "Message": "inactive"}, Rejected),
        (200, {"ErrorCode": 0, "Message": "OK"}, Ambiguous),  # no MessageID
        (204, None, Ambiguous),
        (302, None, Deferred),
        (404, {"ErrorCode": 404, "Message": "not found"}, Rejected),
        (408, None, Deferred),
        (500, {"ErrorCode": 500, "Message": "Internal Server Error"}, Deferred),
        (503, None, Deferred),
    ],
)
async def test_each_answer_becomes_the_outcome_its_table_row_names(
    postmark: PostmarkServer,
    provider: PostmarkProvider,
    status: int,
    body: Any,
    expected: type,
) -> None:
    postmark.fail_next(status, body)

    outcome = await provider.send(outgoing_email(0))

    assert type(outcome) is expected, outcome
    assert postmark.sent() == []


def test_every_documented_error_code_has_a_row() -> None:
    documented = {10, 100, 300, 400, 401, 402, 403, 405, 406, 409, 410, 411, 412, 413, 429}
    assert documented <= set(ERROR_CODES)


async def test_a_429_is_throttled_with_postmarks_retry_after(
    postmark: PostmarkServer, provider: PostmarkProvider
) -> None:
    postmark.fail_next(
        429, {"ErrorCode": 429, "Message": "Rate limit exceeded"}, headers={"Retry-After": "7"}
    )

    outcome = await provider.send(outgoing_email(0))

    assert outcome == Throttled(
        "Postmark HTTP 429 ErrorCode 429: Rate limit exceeded", retry_after=timedelta(seconds=7)
    )


async def test_a_partial_acceptance_keeps_postmarks_words_as_its_detail(
    postmark: PostmarkServer, provider: PostmarkProvider
) -> None:
    note = "Message OK, but will not deliver to these inactive addresses: cat@example.com."
    postmark.fail_next(200, {"ErrorCode": 0, "Message": note, "MessageID": "pm-1"})

    outcome = await provider.send(outgoing_email(0))

    assert outcome == Accepted("pm-1", detail=note)


async def test_accepted_then_timeout_is_ambiguous_never_keyed_and_sent_once(
    postmark: PostmarkServer, provider: PostmarkProvider
) -> None:
    postmark.hang_after_accept()

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Ambiguous) and not outcome.keyed  # Postmark has no key
    assert "ReadTimeout" in outcome.error
    assert len(postmark.sent()) == 1
    assert provider.idempotency_window is None  # so the worker marks it unknown


async def test_accepted_then_dropped_connection_is_ambiguous(
    postmark: PostmarkServer, provider: PostmarkProvider
) -> None:
    postmark.drop_after_accept()

    outcomes = await provider.send_batch(emails(2))

    assert all(isinstance(o, Ambiguous) and not o.keyed for o in outcomes), outcomes
    assert len(postmark.sent()) == 2


async def test_a_refused_connection_is_deferred() -> None:
    provider = PostmarkProvider(api_key="token-9", base_url=f"http://127.0.0.1:{free_port()}")
    try:
        outcome = await provider.send(outgoing_email(0))
    finally:
        await provider.aclose()
    assert isinstance(outcome, Deferred) and "ConnectError" in outcome.error


async def test_the_token_never_reaches_an_error_text(
    postmark: PostmarkServer, provider: PostmarkProvider
) -> None:
    postmark.fail_next(422, {"ErrorCode": 300, "Message": f"bad token {postmark.token}"})

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Rejected)
    assert postmark.token not in outcome.error and "[redacted]" in outcome.error
    assert postmark.token not in repr(provider)


async def test_without_a_token_nothing_is_sent_and_no_attempt_is_spent() -> None:
    provider = PostmarkProvider(api_key="")
    try:
        assert isinstance(await provider.send(outgoing_email(0)), Disabled)
        assert all(isinstance(o, Disabled) for o in await provider.send_batch(emails(2)))
    finally:
        await provider.aclose()


# --- reconciliation ----------------------------------------------------------------------


async def test_find_sent_sees_a_send_by_our_metadata_and_only_ours(
    postmark: PostmarkServer, provider: PostmarkProvider
) -> None:
    ours, other = outgoing_email(0), outgoing_email(0)  # the same recipient
    await provider.send_batch([ours, other])

    sightings = await provider.find_sent(_message_like(ours), ours.rfc_message_id)

    (sighting,) = sightings
    assert sighting.message_id == ours.message_id
    assert sighting.provider_message_id == postmark.sent()[0].message_id
    assert sighting.recipient == "user0@example.com"
    search = postmark.requests[-1]
    assert search.query[f"metadata_{METADATA_KEY}"] == str(ours.message_id)
    assert search.query["recipient"] == "user0@example.com"


async def test_a_lookup_postmark_cannot_answer_raises(
    postmark: PostmarkServer, provider: PostmarkProvider
) -> None:
    postmark.fail_next(500, {"ErrorCode": 500, "Message": "down"}, matches=lambda r: True)

    with pytest.raises(PostmarkLookupError, match="500"):
        await provider.find_sent(_message_like(outgoing_email(0)), "<x@y>")


# --- registration ------------------------------------------------------------------------


async def test_it_is_registered_with_its_settings_and_capabilities() -> None:
    provider = create("postmark", Settings(postmark_api_key=SecretStr("tok")))
    try:
        assert isinstance(provider, PostmarkProvider) and "tok" not in repr(provider)
        assert provider.base_url == "https://api.postmarkapp.com"
        assert provider.message_stream == "outbound"
    finally:
        await provider.aclose()
    assert capabilities("postmark") == PostmarkProvider.capabilities
    assert PostmarkProvider.capabilities.utf8_local_part is False  # addresses go as ASCII


def _message_like(email: OutgoingEmail) -> Any:
    """The stored message `find_sent` is given, for one outgoing email."""
    from types import SimpleNamespace

    return SimpleNamespace(id=email.message_id, to_address=email.to_email, provider_message_id=None)


def test_the_fake_server_refuses_what_the_postmark_spec_refuses() -> None:
    """The check every test leans on: a body against the spec is a 422 and a violation."""
    import httpx

    with PostmarkServer() as server:
        answer = httpx.post(
            f"{server.url}/email",
            json={"From": "a@example.com", "To": "b@example.com", "Attachments": [{"Name": "x"}]},
            headers={"x-postmark-server-token": server.token},
        )
        assert answer.status_code == 422 and server.sent() == []
        (violation,) = server.violations
        assert "Content" in violation or "HtmlBody" in violation
