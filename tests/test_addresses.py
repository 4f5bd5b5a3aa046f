"""Accepted means sendable: what enqueue takes, the configured provider can carry.

Text that would break a header line, addresses the provider cannot send to (a UTF-8 local
part on SES or Brevo), test domains where the setting forbids them, and templates that
would not render are refused at enqueue (HTTP 422, CLI exit 2) with the reason, and nothing
is written. Brevo gets IDN domains in punycode, as its schema demands. Reconciliation never
settles a message from a provider record that is not its own.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from api_helpers import api_client, new_tenant
from mailbag.cli import app
from mailbag.domain.delivery import Accepted, Decision, Rejected
from mailbag.domain.message import InvalidMessage, new_message
from mailbag.domain.states import Action, Status
from mailbag.providers.brevo import BrevoProvider, batch_payload, single_payload
from mailbag.providers.ses import SESProvider
from mailbag.services import outbox as outbox_service
from mailbag.services.reconciliation import Reconciler
from mailbag.settings import Settings

from brevo_server import BrevoServer, Endpoint
from brevo_server import _validate_send as validate_brevo_send
from conftest import TestDB
from helpers import claim, count_rows, finalize, get, message, outgoing_email

BODY = {"to": "ada@example.com", "template": "welcome", "data": {"name": "Ada"}}
# Every character str.splitlines() breaks at but CR/LF (refused before), and other controls.
BREAKERS = ["\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x00", "\x7f", "\x9b"]


# --- the API ---------------------------------------------------------------------------------


async def post(db: TestDB, body: dict[str, Any], **settings: Any) -> Any:
    _, key = new_tenant(db, f"tenant-{uuid.uuid4().hex[:8]}")
    async with api_client(db, key, **settings) as api:
        return await api.post("/v1/messages", json=body)


async def test_a_line_breaking_or_control_character_is_a_422(db) -> None:
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        for char in BREAKERS:
            text = f"Hello{char}X-Injected: yes"
            for body in (
                {**BODY, "subject": text},
                {**BODY, "to_name": text},
                {**BODY, "headers": {"X-Note": text}},
            ):
                r = await api.post("/v1/messages", json=body)
                assert r.status_code == 422, (body, r.text)
                # NUL is refused by the request schema already; the rest by the message rules.
                slug = r.json()["type"].rsplit("/", 1)[1]
                assert slug in {"invalid-message", "validation-error"}
    assert count_rows(db) == (0, 0)


async def test_an_encoded_word_is_accepted_and_stored_as_written(db) -> None:
    text = "=?utf-8?q?Hello=0D=0AX-Injected:_yes?=\ttab"
    r = await post(db, {**BODY, "subject": text, "to_name": text, "headers": {"X-Note": text}})
    assert r.status_code == 201, r.text
    assert r.json()["subject"] == text and r.json()["headers"] == {"X-Note": text}


async def test_a_missing_template_variable_is_a_422(db) -> None:
    r = await post(db, {**BODY, "data": {}})
    assert r.status_code == 422, r.text
    assert "'name' is undefined" in r.text
    assert count_rows(db) == (0, 0)


async def test_data_that_breaks_the_rendered_subject_is_a_422(db) -> None:
    r = await post(db, {**BODY, "data": {"name": "Ada\u2028Bcc: evil@example.com"}})
    assert r.status_code == 422, r.text
    assert "subject" in r.json()["detail"]
    assert count_rows(db) == (0, 0)


async def test_test_domains_are_accepted_with_a_local_provider_by_default(db) -> None:
    r = await post(db, {**BODY, "to": "reader@example.test"})  # provider: file
    assert r.status_code == 201, r.text
    _, key = new_tenant(db, "other")
    async with api_client(db, key) as api:
        r = await api.post(
            "/v1/email-verifications",
            json={"email": "reader@example.test"},
            headers={"Idempotency-Key": "v1"},
        )
    assert r.status_code == 201, r.text  # the verification design's own example


async def test_test_domains_are_refused_naming_the_setting_with_a_real_provider(db) -> None:
    for to in ("reader@example.test", "a@x.invalid", "a@localhost"):
        r = await post(db, {**BODY, "to": to}, provider="smtp")
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert "special-use or reserved name" in detail and "MAILBAG_ALLOW_TEST_DOMAINS" in detail
    assert count_rows(db) == (0, 0)
    r = await post(
        db, {**BODY, "to": "reader@example.test"}, provider="smtp", allow_test_domains=True
    )
    assert r.status_code == 201, r.text


async def test_verification_refuses_a_test_domain_with_a_real_provider(db) -> None:
    _, key = new_tenant(db)
    async with api_client(db, key, provider="smtp") as api:
        r = await api.post(
            "/v1/email-verifications",
            json={"email": "reader@example.test"},
            headers={"Idempotency-Key": "v1"},
        )
    assert r.status_code == 422 and "MAILBAG_ALLOW_TEST_DOMAINS" in r.text


@pytest.mark.parametrize(("provider", "status"), [("ses", 422), ("brevo", 422), ("smtp", 201)])
async def test_a_utf8_local_part_is_refused_where_the_provider_cannot_carry_it(
    db, provider: str, status: int
) -> None:
    r = await post(db, {**BODY, "to": "zoë@example.com"}, provider=provider)
    assert r.status_code == status, r.text
    if status == 422:
        assert f"({provider}) cannot send" in r.json()["detail"]


# --- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAILBAG_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    runner = CliRunner()
    # A render is checked against the tenant's templates too: the database must be there.
    assert runner.invoke(app, ["migrate"]).exit_code == 0

    def invoke(*args: str, **env: str) -> Any:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return runner.invoke(app, ["enqueue", "--template", "welcome", *args])

    return invoke


@pytest.mark.parametrize(
    ("args", "env", "complaint"),
    [
        (["--to", "a@example.com", "--data", '{"name": "A"}', "--subject", "a\vb"], {}, "line"),
        (["--to", "a@example.com", "--data", '{"name": "A"}', "--to-name", "a\u2028"], {}, "line"),
        (["--to", "a@example.com", "--data", "{}"], {}, "'name' is undefined"),
        (
            ["--to", "a@example.test", "--data", '{"name": "A"}'],
            {"MAILBAG_PROVIDER": "smtp"},
            "MAILBAG_ALLOW_TEST_DOMAINS",
        ),
        (
            ["--to", "zoë@example.com", "--data", '{"name": "A"}'],
            {"MAILBAG_PROVIDER": "ses"},
            "(ses) cannot send",
        ),
    ],
)
def test_the_cli_refuses_what_cannot_be_sent_with_exit_2(cli, args, env, complaint) -> None:
    result = cli(*args, **env)
    assert result.exit_code == 2, result.output
    assert complaint in result.output


# --- the domain rule itself ------------------------------------------------------------------


def test_a_structured_header_must_be_given_in_ascii() -> None:
    with pytest.raises(InvalidMessage, match="structured"):
        new_message(to="a@example.com", template="welcome", headers={"Reply-To": "Zoë <z@e.com>"})
    ok = new_message(to="a@example.com", template="welcome", headers={"X-Note": "Zoë"})
    assert ok.headers == {"X-Note": "Zoë"}


def test_tags_refuse_control_characters() -> None:
    with pytest.raises(InvalidMessage, match="tags"):
        new_message(to="a@example.com", template="welcome", tags=["a\u2028b"])


# --- Brevo: punycode, and its schema ------------------------------------------------------------


def test_brevo_gets_idn_domains_in_punycode_for_every_address() -> None:
    sent = outgoing_email(1, to_email="user@bücher.example", from_email="news@bücher.example")
    payload = single_payload(sent)
    assert payload["to"] == [{"email": "user@xn--bcher-kva.example", "name": "User 1"}]
    assert payload["sender"]["email"] == "news@xn--bcher-kva.example"
    validate_brevo_send(payload)  # what Brevo's schema accepts
    batch = batch_payload([sent, outgoing_email(2, to_email="b@straße.example")])
    assert [v["to"][0]["email"] for v in batch["messageVersions"]] == [
        "user@xn--bcher-kva.example",
        "b@xn--strae-oqa.example",  # IDNA 2008, as email_validator normalizes: not "strasse"
    ]
    validate_brevo_send(batch)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p["to"][0].update(email="user@bücher.example"),  # Unicode: not `format: email`
        lambda p: p["to"][0].update(email="zoë@example.com"),
        lambda p: p["sender"].update(email="not an address"),
        lambda p: p.update(to=[{"name": "no email"}]),
        lambda p: p.update(subject=7),
        lambda p: p.update(tags="one"),
        lambda p: p.update(headers={"X-A": 1}),
        lambda p: p.update(unknownField=True),
        lambda p: p.update(scheduledAt="tomorrow"),
    ],
)
async def test_the_fake_brevo_refuses_what_brevos_schema_refuses(mutate) -> None:
    payload = single_payload(outgoing_email(1))
    mutate(payload)
    with BrevoServer() as brevo:
        provider = BrevoProvider(api_key=brevo.api_key, base_url=brevo.url)
        answer = await provider._post(payload)
        await provider.aclose()
    assert answer.status == 400, answer.body
    assert brevo.delivered() == []


async def test_brevo_sends_an_idn_recipient_and_batch_versions_it_accepts() -> None:
    emails = [outgoing_email(i, to_email=f"u{i}@bücher.example") for i in range(3)]
    with BrevoServer() as brevo:
        provider = BrevoProvider(api_key=brevo.api_key, base_url=brevo.url)
        single = await provider.send(emails[0])
        batch = await provider.send_batch(emails[1:])
        await provider.aclose()
    assert all(isinstance(o, Accepted) for o in [single, *batch]), [single, *batch]
    assert [d.to_emails for d in brevo.delivered()] == [
        [f"u{i}@xn--bcher-kva.example"] for i in range(3)
    ]
    assert len(brevo.send_requests()) == 2  # the two in one batch call


async def test_brevo_and_ses_reject_a_utf8_local_part_without_sending() -> None:
    sent = outgoing_email(1, to_email="zoë@example.com")
    with BrevoServer() as brevo:
        provider = BrevoProvider(api_key=brevo.api_key, base_url=brevo.url)
        outcome = await provider.send(sent)
        await provider.aclose()
    assert isinstance(outcome, Rejected) and "non-ASCII local part" in outcome.error
    assert brevo.requests == []
    ses = SESProvider.from_settings(Settings(provider="ses", ses_endpoint_url="http://127.0.0.1:9"))
    outcome = await ses.send(sent)
    await ses.aclose()
    assert isinstance(outcome, Rejected) and "non-ASCII local part" in outcome.error


# --- reconciliation ----------------------------------------------------------------------------


def unknown_message(db: TestDB, to: str) -> Any:
    with db.engine.begin() as conn:
        (result,) = outbox_service.write_many(conn, [message(0, to=to)])
    batch = claim(db, now=datetime.now(UTC))
    finalize(
        db,
        batch.token,
        (result.message.id, Decision(Action.MARK_UNKNOWN, error="connection lost")),
        now=datetime.now(UTC),
    )
    return get(db, result.message.id)


def brevo_record(message_id: uuid.UUID, email: str, brevo_id: str) -> dict[str, Any]:
    return {
        "email": email,
        "subject": "Welcome",
        "messageId": brevo_id,
        "uuid": str(uuid.uuid4()),
        "date": datetime.now(UTC).isoformat(),
        "from": "sender@example.com",
        "tags": ["test", f"mailbag-{message_id}"],
    }


async def test_reconciliation_never_settles_from_someone_elses_record(db, async_engine) -> None:
    ours = unknown_message(db, to="reader@example.com")
    other = brevo_record(uuid.uuid4(), "reader@example.com", "<other@smtp-relay.mailin.fr>")
    with BrevoServer() as brevo:
        # Every lookup answers with another message's record (same recipient).
        brevo.fail_next(
            200, {"count": 1, "transactionalEmails": [other]}, endpoint=Endpoint.LOOKUP, times=10
        )
        provider = BrevoProvider(api_key=brevo.api_key, base_url=brevo.url)
        reconciler = Reconciler(
            async_engine, providers={provider.name: provider}, flag_after=timedelta(0)
        )
        outcomes = await reconciler.run_once(datetime.now(UTC))
        await provider.aclose()
    assert outcomes == {"flagged": 1}
    after = get(db, ours.id)
    assert after.status == Status.UNKNOWN and after.provider_message_id is None


async def test_reconciliation_settles_from_the_messages_own_record(db, async_engine) -> None:
    ours = unknown_message(db, to="reader@example.com")
    mine = brevo_record(ours.id, "reader@example.com", "<mine@smtp-relay.mailin.fr>")
    other = brevo_record(uuid.uuid4(), "reader@example.com", "<other@smtp-relay.mailin.fr>")
    with BrevoServer() as brevo:
        brevo.fail_next(
            200, {"count": 2, "transactionalEmails": [other, mine]}, endpoint=Endpoint.LOOKUP
        )
        provider = BrevoProvider(api_key=brevo.api_key, base_url=brevo.url)
        outcomes = await Reconciler(async_engine, providers={provider.name: provider}).run_once(
            datetime.now(UTC)
        )
        await provider.aclose()
    assert outcomes == {"resolved_sent": 1}
    assert get(db, ours.id).provider_message_id == "<mine@smtp-relay.mailin.fr>"
