"""Every Python door refuses what the deployment cannot send, as the API and the CLI do
(issue 22, point 9): `mailbag.enqueue`, `enqueue_async`, `enqueue_many` and
`enqueue_many_async` check each message under the deployment's Settings (the provider's
limits and address rules, the worker's templates, a render with the data), read once per
process, unless the caller gives other settings or rules. The Django doors are shown in
test_django.py, on Django's own databases."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

import mailbag
from api_helpers import api_client, new_tenant
from mailbag.domain.content import Limits
from mailbag.services import intake
from mailbag.settings import Settings
from mailbag.store.schema import attachments, message_attachments

from conftest import TestDB
from helpers import count_rows, get, tiny_pdf

BIN = mailbag.Attachment("data.bin", "application/octet-stream", b"\x00\x01 raw bytes")
PDF = mailbag.Attachment("data.pdf", "application/pdf", tiny_pdf())


@pytest.fixture
def brevo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's deployment sends with Brevo, which refuses `.bin` attachments. The
    rules are read once per process: forgotten before and after, so the test reads these."""
    for name in ("MAILBAG_ALLOW_TEST_DOMAINS", "MAILBAG_TEMPLATES_DIR", "MAILBAG_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MAILBAG_PROVIDER", "brevo")
    monkeypatch.setenv("MAILBAG_BREVO_API_KEY", "xkeysib-test")
    intake.deployment_rules.cache_clear()
    yield
    intake.deployment_rules.cache_clear()


def ready_made(attachment: mailbag.Attachment, **fields: Any) -> dict[str, Any]:
    return {
        "to": "ada@example.com",
        "subject": "Your data",
        "text": "Attached.",
        "attachments": [attachment],
        **fields,
    }


async def through(door: str, db: TestDB, **fields: Any) -> mailbag.Message:
    """One message through the named public door, in a transaction of the caller's."""
    if door == "enqueue":
        with db.engine.begin() as conn:
            return mailbag.enqueue(conn, **fields).message
    if door == "enqueue_many":
        with db.engine.begin() as conn:
            (result,) = mailbag.enqueue_many(conn, [mailbag.new_message(**fields)])
            return result.message
    engine = db.async_engine()
    try:
        async with engine.begin() as conn:
            if door == "enqueue_async":
                return (await mailbag.enqueue_async(conn, **fields)).message
            (result,) = await mailbag.enqueue_many_async(conn, [mailbag.new_message(**fields)])
            return result.message
    finally:
        await engine.dispose()


def attachment_rows(db: TestDB) -> tuple[int, int]:
    with db.engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(attachments)).scalar_one()
        linked = conn.execute(select(func.count()).select_from(message_attachments)).scalar_one()
    return stored, linked


DOORS = ["enqueue", "enqueue_async", "enqueue_many", "enqueue_many_async"]


@pytest.mark.parametrize("door", DOORS)
async def test_each_python_door_refuses_an_attachment_the_configured_provider_cannot_carry(
    db, brevo, door
):
    with pytest.raises(mailbag.InvalidMessage) as refused:
        await through(door, db, **ready_made(BIN))
    assert set(refused.value.errors) == {"attachments"}
    assert "(brevo) does not accept" in str(refused.value) and "(bin)" in str(refused.value)
    assert count_rows(db) == (0, 0)
    assert attachment_rows(db) == (0, 0)

    message = await through(door, db, **ready_made(PDF))  # what Brevo takes still goes
    assert get(db, message.id).status == mailbag.Status.PENDING
    assert count_rows(db) == (1, 1) and attachment_rows(db) == (1, 1)


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_the_python_doors_refuse_what_the_api_refuses_with_the_same_words(db, brevo):
    tenant, key = new_tenant(db)
    body = {
        "to": "ada@example.com",
        "subject": "Your data",
        "text": "Attached.",
        "attachments": [
            {"filename": "data.bin", "content_type": "application/octet-stream", "content": "AA=="}
        ],
    }
    async with api_client(db, key, provider="brevo") as api:
        answer = await api.post("/v1/messages", json=body)
    assert answer.status_code == 422, answer.text
    api_says = str(answer.json())
    with pytest.raises(mailbag.InvalidMessage) as refused:
        await through("enqueue", db, **ready_made(BIN, tenant_id=tenant))
    assert refused.value.errors["attachments"] in api_says


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
@pytest.mark.parametrize("door", DOORS)
async def test_each_python_door_renders_a_template_once_and_knows_the_workers_templates(
    db, brevo, door
):
    with pytest.raises(mailbag.InvalidMessage, match="does not render with this data"):
        await through(door, db, to="ada@example.com", template="welcome", data={})
    with pytest.raises(mailbag.InvalidMessage, match="unknown template 'no-such-template'"):
        await through(door, db, to="ada@example.com", template="no-such-template")
    assert count_rows(db) == (0, 0)
    message = await through(door, db, to="ada@example.com", template="welcome", data={"name": "A"})
    assert message.template_name == "welcome"


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_the_deployments_address_rules_apply_too(db, brevo):
    """Brevo cannot carry a UTF-8 local part, and it sends for real: no test domains."""
    with db.engine.begin() as conn:
        for to in ("zoë@example.com", "ada@shop.test"):
            with pytest.raises(mailbag.InvalidMessage) as refused:
                mailbag.enqueue(conn, to=to, subject="Hi", text="hi")
            assert set(refused.value.errors) == {"to"}
    assert count_rows(db) == (0, 0)


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_settings_or_rules_given_explicitly_win_over_the_deployments(db, brevo):
    local = Settings(provider="file", database_url=db.url)
    with db.engine.begin() as conn:
        mine = mailbag.enqueue(conn, settings=local, **ready_made(BIN)).message
        (many,) = mailbag.enqueue_many(
            conn, [mailbag.new_message(**ready_made(BIN))], settings=local
        )
        lax = mailbag.enqueue(conn, limits=Limits(), **ready_made(BIN)).message
    assert [m.attachment_count for m in (mine, many.message, lax)] == [1, 1, 1]


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_the_deployments_rules_are_read_once_per_process(db, brevo, monkeypatch):
    with db.engine.begin() as conn:
        mailbag.enqueue(conn, **ready_made(PDF))
    monkeypatch.setenv("MAILBAG_PROVIDER", "file")  # too late: this process read brevo
    with pytest.raises(mailbag.InvalidMessage, match="brevo"), db.engine.begin() as conn:
        mailbag.enqueue(conn, **ready_made(BIN))
    assert intake.deployment_rules().limits.provider == "brevo"


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_max_attempts_defaults_to_the_deployments_setting(db, brevo, monkeypatch):
    monkeypatch.setenv("MAILBAG_MAX_ATTEMPTS", "9")
    intake.deployment_rules.cache_clear()
    with db.engine.begin() as conn:
        default = mailbag.enqueue(conn, to="ada@example.com", subject="a", text="a").message
        given = mailbag.enqueue(
            conn, to="ada@example.com", subject="b", text="b", max_attempts=2
        ).message
    assert (default.max_attempts, given.max_attempts) == (9, 2)


def test_a_message_built_again_from_its_fields_is_the_same_message():
    """`enqueue_many` checks a NewMessage again from `NewMessage.fields()`: every field
    must come back as it was, or the check would write something else."""
    soon = datetime(2030, 1, 2, 3, 4, tzinfo=UTC)
    full = mailbag.new_message(
        to=[mailbag.Address("Ada@Example.com", "Ada"), "bob@example.com"],
        cc=["carol@example.com"],
        bcc=["dave@example.com"],
        reply_to=mailbag.Address("help@example.com", "Help"),
        from_address="shop@example.com",
        from_name="Shop",
        subject="Your invoice",
        html="<style>p{color:red}</style><p>Invoice</p>",
        inline_css=True,
        attachments=[PDF],
        headers={"X-Order": "42"},
        tags=["invoice"],
        metadata={"order": 42},
        tenant_id="acme",
        idempotency_key="invoice-42",
        send_at=soon,
        expires_at=soon + timedelta(days=1),
        priority="high",
        unsubscribe_url="https://example.com/unsubscribe",
        unsubscribe_mailto="unsubscribe@example.com",
        max_attempts=3,
    )
    templated = mailbag.new_message(
        to="ada@example.com", template="welcome", data={"n": 1}, locale="fr-ca"
    )
    for message in (full, templated):
        assert mailbag.new_message(**message.fields()) == message
    # Every field is given back (a new one must be added to `fields` too).
    # (`pin` is not one: the version is decided when the message is written.)
    given_back = set(vars(full)) - {"recipients", "template_name", "template_data", "pin"}
    assert set(full.fields()) >= given_back
