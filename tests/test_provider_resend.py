"""The Resend provider against a real HTTP server that behaves like Resend's API
(tests/resend_server.py), every request checked against Resend's published spec."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import SecretStr

from mailbag.compose import OutgoingEmail
from mailbag.domain.content import Address, Attachment, Recipients
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
from mailbag.providers import capabilities, create
from mailbag.providers.resend import (
    IDEMPOTENCY_WINDOW,
    TAG_NAME,
    ResendLookupError,
    ResendProvider,
    tag_text,
)
from mailbag.settings import Settings
from resend_server import ResendServer

from helpers import T0, outgoing_email, tiny_pdf, tiny_png

CLIENT_TIMEOUT = 0.5  # seconds: short, so the "accepted, then silence" cases stay quick


@pytest.fixture
def resend() -> Iterator[ResendServer]:
    with ResendServer() as server:
        yield server
        assert server.violations == []  # every request conformed to Resend's spec


@pytest.fixture
async def provider(resend: ResendServer) -> AsyncIterator[ResendProvider]:
    client = ResendProvider(
        api_key=resend.api_key, base_url=resend.url, timeout=CLIENT_TIMEOUT, max_connections=8
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


def with_attachments(i: int = 0) -> OutgoingEmail:
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
        headers={"X-Campaign": "welcome"},
        unsubscribe_url="https://example.com/u/1",
        tags=["billing.monthly", "vip"],
    )


def stored_message(email: OutgoingEmail, provider_message_id: str | None = None) -> Any:
    """The stored message `find_sent` is given, for one outgoing email."""
    return SimpleNamespace(
        id=email.message_id, to_address=email.to_email, provider_message_id=provider_message_id
    )


# --- the happy paths --------------------------------------------------------------------


async def test_a_single_send_posts_resends_shape_with_the_attempts_key(
    resend: ResendServer, provider: ResendProvider
) -> None:
    email = outgoing_email(0, headers={"X-Campaign": "welcome"})

    outcome = await provider.send(email)

    (request,) = resend.requests
    assert (request.method, request.path) == ("POST", "/emails")
    assert request.headers["authorization"] == f"Bearer {resend.api_key}"
    assert request.headers["idempotency-key"] == email.idempotency_key
    assert request.json == {
        "from": "Sender <sender@example.com>",
        "to": ["User 0 <user0@example.com>"],
        "subject": "Hello 0",
        "html": "<p>Hello 0</p>",
        "text": "Hello 0",
        "headers": {
            "X-Campaign": "welcome",
            "X-Mailbag-Message-ID": str(email.message_id),
            "Message-ID": email.rfc_message_id,
        },
        "tags": [
            {"name": "test", "value": "true"},
            {"name": TAG_NAME, "value": str(email.message_id)},
        ],
    }
    (sent,) = resend.sent()
    assert outcome == Accepted(sent.id)


async def test_every_part_of_an_email_travels_in_its_resend_field(
    resend: ResendServer, provider: ResendProvider
) -> None:
    email = with_attachments()

    assert isinstance(await provider.send(email), Accepted)

    (sent,) = resend.sent()
    body = sent.request
    assert body["to"] == ['"Ann, Esq." <ann@example.com>', "bob@xn--bcher-kva.example"]
    assert body["cc"] == ["Cat <cat@example.com>"]
    assert body["bcc"] == ["dan@example.com"]  # its own field: envelope only
    assert body["reply_to"] == ["Help Desk <help@example.com>", "also@example.com"]
    assert body["html"] == '<p>Hi <img src="cid:logo"></p>'
    pdf, pdf_fields = sent.attachment("invoice.pdf")
    png, png_fields = sent.attachment("logo.png")
    assert (pdf, png) == (tiny_pdf(), tiny_png())
    assert "content_id" not in pdf_fields and png_fields["content_id"] == "logo"
    assert png_fields["content_type"] == "image/png"
    assert sent.headers["List-Unsubscribe"] == "<https://example.com/u/1>"
    assert sent.headers["Message-ID"] == email.rfc_message_id
    assert sent.tags == {"billing_monthly": "true", "vip": "true", TAG_NAME: str(email.message_id)}


@pytest.mark.parametrize(
    ("tag", "sent_as"),
    [("vip", "vip"), ("billing.monthly", "billing_monthly"), ("café au lait", "caf__au_lait")],
)
def test_a_tag_goes_in_the_characters_resend_allows(tag: str, sent_as: str) -> None:
    assert tag_text(tag) == sent_as
    assert len(tag_text("x" * 300)) == 256


async def test_a_batch_without_attachments_is_one_call_ids_in_order(
    resend: ResendServer, provider: ResendProvider
) -> None:
    batch = emails(3)

    outcomes = await provider.send_batch(batch)

    (request,) = resend.requests
    assert request.path == "/emails/batch" and len(request.json) == 3
    assert "idempotency-key" not in request.headers  # no per-email key in a batch
    assert accepted_ids(outcomes) == [s.id for s in resend.sent()]


async def test_an_email_with_attachments_goes_alone_and_keyed_the_rest_in_a_batch(
    resend: ResendServer, provider: ResendProvider
) -> None:
    batch = [outgoing_email(0), with_attachments(1), outgoing_email(2)]

    outcomes = await provider.send_batch(batch)

    by_path = {r.path: r for r in resend.requests}
    assert len(by_path["/emails/batch"].json) == 2
    assert by_path["/emails"].headers["idempotency-key"] == batch[1].idempotency_key
    by_tag = {s.tags[TAG_NAME]: s.id for s in resend.sent()}
    assert accepted_ids(outcomes) == [by_tag[str(e.message_id)] for e in batch]


async def test_more_than_100_emails_go_in_calls_of_at_most_100(
    resend: ResendServer,
) -> None:
    batch = emails(150)
    # The test server checks each call against the spec: seconds on a loaded machine, past
    # the fixture's short timeout.
    provider = ResendProvider(api_key=resend.api_key, base_url=resend.url, timeout=30)
    try:
        outcomes = await provider.send_batch(batch)
    finally:
        await provider.aclose()

    assert sorted(len(r.json) for r in resend.requests) == [50, 100]
    by_tag = {s.tags[TAG_NAME]: s.id for s in resend.sent()}
    assert accepted_ids(outcomes) == [by_tag[str(e.message_id)] for e in batch]


async def test_a_batch_refused_for_one_email_is_sent_one_by_one_so_only_it_fails(
    resend: ResendServer, provider: ResendProvider
) -> None:
    resend.reject_recipient("user1@example.com")

    outcomes = await provider.send_batch(emails(3))

    assert isinstance(outcomes[0], Accepted) and isinstance(outcomes[2], Accepted)
    assert isinstance(outcomes[1], Rejected) and "validation_error" in outcomes[1].error
    assert len(resend.sent()) == 2
    singles = [r for r in resend.requests if r.path == "/emails"]
    assert len(singles) == 3 and all("idempotency-key" in r.headers for r in singles)


# --- idempotency ---------------------------------------------------------------------------


def test_the_key_window_is_resends_24_hours() -> None:
    assert ResendProvider(api_key=None).idempotency_window == IDEMPOTENCY_WINDOW
    assert timedelta(hours=24) == IDEMPOTENCY_WINDOW


async def test_a_send_that_timed_out_is_resent_under_its_key_and_delivered_once(
    resend: ResendServer, provider: ResendProvider
) -> None:
    email = outgoing_email(0)
    resend.hang_after_accept()

    first = await provider.send(email)
    decision = decide(
        first,
        Attempt(number=1, max_attempts=5, claimed_at=T0, ambiguous_since=None),
        now=T0 + timedelta(minutes=1),
        policy=RetryPolicy(),
        key_window=provider.idempotency_window,
    )
    second = await provider.send(email)  # the same attempt again: the same key

    assert isinstance(first, Ambiguous) and first.keyed and "ReadTimeout" in first.error
    assert decision.action is Action.RETRY and decision.keep_attempt
    (sent,) = resend.sent()
    assert second == Accepted(sent.id)
    keys = [r.headers["idempotency-key"] for r in resend.requests]
    assert keys == [email.idempotency_key] * 2


async def test_the_same_key_with_another_body_is_unknown_not_rejected(
    resend: ResendServer, provider: ResendProvider
) -> None:
    email = outgoing_email(0)
    resend.hang_after_accept()
    await provider.send(email)
    changed = outgoing_email(0, message_id=email.message_id, subject="Changed")

    outcome = await provider.send(changed)

    assert isinstance(outcome, Ambiguous) and not outcome.keyed
    assert "invalid_idempotent_request" in outcome.error
    assert len(resend.sent()) == 1


async def test_a_key_still_in_progress_is_ambiguous_and_keyed(
    resend: ResendServer, provider: ResendProvider
) -> None:
    resend.fail_next(
        409,
        {"statusCode": 409, "name": "concurrent_idempotent_requests", "message": "in progress"},
    )

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Ambiguous) and outcome.keyed


# --- every row of the table ------------------------------------------------------------------


def _error(status: int, name: str) -> dict[str, Any]:
    return {"statusCode": status, "name": name, "message": f"injected {name}"}


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (401, _error(401, "missing_api_key"), Disabled),
        (401, _error(401, "validation_error"), Disabled),  # "API key is invalid"
        (403, _error(403, "invalid_api_key"), Disabled),
        (403, _error(403, "suspended_api_key"), Disabled),
        (403, _error(403, "validation_error"), Rejected),  # an unverified domain
        (400, _error(400, "validation_error"), Rejected),
        (400, _error(400, "invalid_idempotency_key"), Rejected),
        (422, _error(422, "invalid_attachment"), Rejected),
        (422, _error(422, "missing_required_field"), Rejected),
        (429, _error(429, "rate_limit_exceeded"), Throttled),
        (429, _error(429, "daily_quota_exceeded"), Throttled),
        (500, _error(500, "application_error"), Deferred),
        (503, _error(503, "service_unavailable"), Deferred),
        (302, None, Deferred),
        (200, {}, Ambiguous),  # a 2xx without an id
    ],
)
async def test_each_answer_becomes_the_outcome_its_table_row_names(
    resend: ResendServer, provider: ResendProvider, status: int, body: Any, expected: type
) -> None:
    resend.fail_next(status, body)

    outcome = await provider.send(outgoing_email(0))

    assert type(outcome) is expected, outcome
    assert resend.sent() == []


async def test_a_429_is_throttled_with_its_retry_after(
    resend: ResendServer, provider: ResendProvider
) -> None:
    resend.fail_next(429, _error(429, "rate_limit_exceeded"), headers={"retry-after": "2"})

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Throttled) and outcome.retry_after == timedelta(seconds=2)


async def test_accepted_then_dropped_connection_is_ambiguous_keyed_alone_unkeyed_in_a_batch(
    resend: ResendServer, provider: ResendProvider
) -> None:
    resend.drop_after_accept(times=2)

    alone = await provider.send(outgoing_email(0))
    batch = await provider.send_batch(emails(2))

    assert isinstance(alone, Ambiguous) and alone.keyed
    assert all(isinstance(o, Ambiguous) and not o.keyed for o in batch), batch
    assert len(resend.sent()) == 3


async def test_a_refused_connection_is_deferred() -> None:
    provider = ResendProvider(api_key="re_key", base_url=f"http://127.0.0.1:{free_port()}")
    try:
        outcome = await provider.send(outgoing_email(0))
    finally:
        await provider.aclose()
    assert isinstance(outcome, Deferred) and "ConnectError" in outcome.error


async def test_the_api_key_never_reaches_an_error_text(
    resend: ResendServer, provider: ResendProvider
) -> None:
    resend.fail_next(422, {"name": "validation_error", "message": f"key {resend.api_key}"})

    outcome = await provider.send(outgoing_email(0))

    assert isinstance(outcome, Rejected) and resend.api_key not in outcome.error
    assert resend.api_key not in repr(provider)


async def test_without_a_key_nothing_is_sent() -> None:
    provider = ResendProvider(api_key=None)
    try:
        assert isinstance(await provider.send(outgoing_email(0)), Disabled)
        assert all(isinstance(o, Disabled) for o in await provider.send_batch(emails(2)))
    finally:
        await provider.aclose()


# --- reconciliation ----------------------------------------------------------------------


async def test_find_sent_reads_the_last_event_of_the_id_resend_gave(
    resend: ResendServer, provider: ResendProvider
) -> None:
    email = outgoing_email(0)
    outcome = await provider.send(email)
    assert isinstance(outcome, Accepted)
    stored = stored_message(email, outcome.provider_message_id)

    resend.set_last_event(outcome.provider_message_id, "delivered")
    (sighting,) = await provider.find_sent(stored, email.rfc_message_id)
    resend.set_last_event(outcome.provider_message_id, "failed")
    after_failure = await provider.find_sent(stored, email.rfc_message_id)

    assert sighting.provider_message_id == outcome.provider_message_id
    assert sighting.message_id == email.message_id
    assert sighting.recipient == "User 0 <user0@example.com>"
    assert after_failure == []  # Resend says it did not send it: no evidence of a send


async def test_find_sent_without_an_id_looks_for_our_message_id_among_recent_emails(
    resend: ResendServer, provider: ResendProvider
) -> None:
    ours = outgoing_email(0)
    await provider.send_batch([*emails(3), ours, *emails(2)])

    sightings = await provider.find_sent(stored_message(ours), ours.rfc_message_id)
    nobody = await provider.find_sent(stored_message(outgoing_email(9)), "<nobody@x>")

    (sighting,) = sightings
    assert sighting.message_id == ours.message_id
    assert sighting.provider_message_id == next(
        s.id for s in resend.sent() if s.tags[TAG_NAME] == str(ours.message_id)
    )
    assert nobody == []


async def test_a_lookup_resend_cannot_answer_raises(
    resend: ResendServer, provider: ResendProvider
) -> None:
    resend.fail_next(500, _error(500, "application_error"), matches=lambda r: True)

    with pytest.raises(ResendLookupError, match="500"):
        await provider.find_sent(stored_message(outgoing_email(0), "some-id"), "<x@y>")


# --- registration ------------------------------------------------------------------------


async def test_it_is_registered_with_its_settings_and_capabilities() -> None:
    provider = create("resend", Settings(resend_api_key=SecretStr("re_abc")))
    try:
        assert isinstance(provider, ResendProvider) and "re_abc" not in repr(provider)
        assert provider.base_url == "https://api.resend.com"
    finally:
        await provider.aclose()
    assert capabilities("resend") == ResendProvider.capabilities
    assert ResendProvider.capabilities.utf8_local_part is False  # addresses go as ASCII


def test_the_fake_server_refuses_what_resends_spec_refuses() -> None:
    """The check every test leans on: a body against the spec is a 422 and a violation."""
    import httpx

    with ResendServer() as server:
        answer = httpx.post(
            f"{server.url}/emails",
            json={"to": ["a@example.com"], "subject": 1},
            headers={"authorization": f"Bearer {server.api_key}"},
        )
        assert answer.status_code == 422 and server.sent() == []
        (violation,) = server.violations
        assert "from" in violation


async def test_a_batch_answer_without_an_id_for_every_email_is_ambiguous(
    resend: ResendServer, provider: ResendProvider
) -> None:
    resend.fail_next(200, {"data": [{"id": "one"}, {"id": 7}]})

    outcomes = await provider.send_batch(emails(2))

    assert all(isinstance(o, Ambiguous) and not o.keyed for o in outcomes), outcomes


async def test_a_reconciliation_run_reads_the_recent_emails_once(
    resend: ResendServer, provider: ResendProvider
) -> None:
    """Lookups share Resend's rate limit with sends: many unknown messages, one list read."""
    batch = emails(3)
    await provider.send_batch(batch)

    found = [await provider.find_sent(stored_message(e), e.rfc_message_id) for e in batch]

    assert [s.message_id for (s,) in found] == [e.message_id for e in batch]
    assert len([r for r in resend.requests if r.method == "GET"]) == 1
