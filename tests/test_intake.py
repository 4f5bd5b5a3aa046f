"""Every door into the outbox goes through the one door, services.intake (issue 23).

For each bad input (an attachment the configured provider cannot carry, an unknown
template, a template that does not render with its data) every door that can express it
refuses it with intake's own words and writes nothing, on each database: the API (POST
/v1/messages and a batch item), email verifications, the CLI (`enqueue`, `send-bulk`),
and `mailbag.enqueue`, `enqueue_async`, `enqueue_many`, `enqueue_many_async`. The two
Django doors are shown on Django's own databases, with the same cases, in test_django.py.

And providers declare what they can carry as a value (providers.base.Capabilities), which
intake turns into the address rules and limits.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

import mailbag
from api_helpers import api_client, new_tenant
from intake_cases import CASES, Case
from mailbag import providers
from mailbag.cli import app as cli_app
from mailbag.providers.base import Capabilities, Provider, built_by
from mailbag.services import intake
from mailbag.settings import Settings
from mailbag.store.schema import attachments, email_verifications

from conftest import TestDB
from helpers import count_rows
from memory_provider import MemoryProvider


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
def case(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Case]:
    """The case, and a deployment (MAILBAG_* as `mailbag worker` reads them) with its
    provider; the deployment's rules are read once per process: forgotten around the test."""
    chosen: Case = request.param
    for name in ("MAILBAG_ALLOW_TEST_DOMAINS", "MAILBAG_TEMPLATES_DIR", "MAILBAG_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MAILBAG_PROVIDER", chosen.provider)
    monkeypatch.setenv("MAILBAG_BREVO_API_KEY", "xkeysib-test")
    intake.deployment_rules.cache_clear()
    yield chosen
    intake.deployment_rules.cache_clear()


# --- the doors: each gives back what it said when it refused the case -------------------------


def python_doors(db: TestDB, case: Case) -> dict[str, str]:
    said = {}
    for door in ("enqueue", "enqueue_many"):
        with pytest.raises(mailbag.InvalidMessage) as refused, db.engine.begin() as conn:
            if door == "enqueue":
                mailbag.enqueue(conn, **case.python_fields())
            else:
                mailbag.enqueue_many(conn, [mailbag.new_message(**case.python_fields())])
        said[f"mailbag.{door}"] = refused.value.errors[case.field]
    return said


async def async_python_doors(db: TestDB, case: Case) -> dict[str, str]:
    said = {}
    engine = db.async_engine()
    try:
        for door in ("enqueue_async", "enqueue_many_async"):
            with pytest.raises(mailbag.InvalidMessage) as refused:
                async with engine.begin() as conn:
                    if door == "enqueue_async":
                        await mailbag.enqueue_async(conn, **case.python_fields())
                    else:
                        message = mailbag.new_message(**case.python_fields())
                        await mailbag.enqueue_many_async(conn, [message])
            said[f"mailbag.{door}"] = refused.value.errors[case.field]
    finally:
        await engine.dispose()
    return said


def api_body(case: Case) -> dict[str, Any]:
    encoded = [
        {"filename": name, "content": base64.b64encode(content).decode()}
        for name, content in case.files.items()
    ]
    return {**case.fields, **({"attachments": encoded} if encoded else {})}


async def api_doors(db: TestDB, case: Case) -> dict[str, str]:
    said = {}
    _, key = new_tenant(db)
    async with api_client(db, key, provider=case.provider) as api:
        single = await api.post("/v1/messages", json=api_body(case))
        assert single.status_code == 422, single.text
        said["POST /v1/messages"] = single.json()["errors"][case.field]
        batch = await api.post("/v1/messages/batch", json={"messages": [api_body(case)]})
        assert batch.status_code == 200, batch.text
        (item,) = batch.json()["results"]
        assert item["result"] == "invalid"
        said["POST /v1/messages/batch"] = item["error"]["errors"][case.field]
        if case.template is not None:  # a verification email is a template with its data
            request = {"email": "ada@example.com", "template": case.template}
            request["data"] = case.fields.get("data", {})
            verification = await api.post(
                "/v1/email-verifications", json=request, headers={"Idempotency-Key": "v-1"}
            )
            assert verification.status_code == 422, verification.text
            said["POST /v1/email-verifications"] = verification.json()["errors"]["template"]
    return said


def cli_doors(
    db: TestDB, case: Case, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)
    runner = CliRunner()
    args = ["enqueue", "--to", case.fields["to"]]
    for option in ("template", "subject", "text"):
        if option in case.fields:
            args += [f"--{option}", case.fields[option]]
    for name, content in case.files.items():
        (folder / name).write_bytes(content)
        args += ["--attach", str(folder / name)]
    said = {}
    enqueued = runner.invoke(cli_app, args)
    assert enqueued.exit_code == 2, enqueued.output
    said["mailbag enqueue"] = enqueued.stderr
    if case.template is not None and not case.files:  # send-bulk: one template, data by row
        sheet = folder / "people.csv"
        sheet.write_text(f"to\n{case.fields['to']}\n", encoding="utf-8")
        bulk = runner.invoke(cli_app, ["send-bulk", str(sheet), "--template", case.template])
        assert bulk.exit_code == 2, bulk.output
        said["mailbag send-bulk"] = bulk.stderr
    return said


def written(db: TestDB) -> tuple[int, int, int, int]:
    """Messages, their events, attachments and verifications in the database."""
    with db.engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(attachments)).scalar_one()
        made = conn.execute(select(func.count()).select_from(email_verifications)).scalar_one()
    return (*count_rows(db), stored, made)


def test_every_door_refuses_a_bad_input_with_the_one_doors_words_and_writes_nothing(
    db: TestDB, case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    words = case.refusal(db.engine)

    async def async_doors() -> dict[str, str]:
        return {**await api_doors(db, case), **await async_python_doors(db, case)}

    said = {
        **python_doors(db, case),
        **asyncio.run(async_doors()),
        **cli_doors(db, case, tmp_path, monkeypatch),
    }
    doors = {"mailbag.enqueue", "mailbag.enqueue_async", "mailbag.enqueue_many"}
    doors |= {"mailbag.enqueue_many_async", "POST /v1/messages", "POST /v1/messages/batch"}
    doors |= {"mailbag enqueue"}
    if case.template is not None:
        doors |= {"POST /v1/email-verifications", "mailbag send-bulk"}
    assert set(said) == doors
    # The API and the Python doors say the words as they are; the CLI within its message.
    exact = {door: text for door, text in said.items() if not door.startswith("mailbag ")}
    assert exact == dict.fromkeys(exact, words)
    assert said["mailbag enqueue"] == f"mailbag: invalid message: {case.field}: {words}\n"
    assert {door for door, text in said.items() if words not in text} == set()
    assert written(db) == (0, 0, 0, 0)


def test_the_same_deployment_takes_the_cases_mended(
    db: TestDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .pdf for Brevo, and the welcome template with its name: the refusals above are
    the input's, not the door's."""
    monkeypatch.setenv("MAILBAG_PROVIDER", "brevo")
    intake.deployment_rules.cache_clear()
    try:
        pdf = mailbag.Attachment("data.pdf", "application/pdf", b"%PDF-1.4")
        with db.engine.begin() as conn:
            sent = mailbag.enqueue(
                conn, to="ada@example.com", subject="Data", text="Attached.", attachments=[pdf]
            )
            welcome = mailbag.enqueue(
                conn, to="bo@example.com", template="welcome", data={"name": "Bo"}
            )
    finally:
        intake.deployment_rules.cache_clear()
    assert sent.created and welcome.created
    assert count_rows(db)[0] == 2


# --- verification: rendered with the token the worker will derive ------------------------------


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_a_verification_email_is_rendered_once_with_its_secrets_and_they_are_not_stored(db):
    """The built-in verify-email template needs {{ token }}: intake renders it with the
    token and link the worker will derive, and the message keeps only their reference."""
    from mailbag.store.schema import outbox_messages

    without = {"email": "ada@example.com", "expires_at": "2030-01-01 00:00 UTC"}
    refused = pytest.raises(mailbag.InvalidMessage, match="'token' is undefined")
    with refused, db.engine.begin() as conn:  # rendered when it is written
        mailbag.enqueue(conn, to="ada@example.com", template="verify-email", data=without)
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        made = await api.post(
            "/v1/email-verifications",
            json={"email": "ada@example.com", "template": "verify-email"},
            headers={"Idempotency-Key": "v-2"},
        )
    assert made.status_code == 201, made.text
    with db.engine.connect() as conn:
        (data, metadata) = conn.execute(
            select(outbox_messages.c.template_data, outbox_messages.c.metadata)
        ).one()
    assert "token" not in data and "link" not in data
    assert metadata["secret_fields"] == ["token", "link"]


# --- providers declare what they can carry ------------------------------------------------------


@pytest.mark.parametrize("name", [*sorted(providers.BUILTIN), "memory"])
def test_each_registered_provider_class_declares_its_capabilities_as_a_value(name: str) -> None:
    assert MemoryProvider.capabilities == Capabilities()  # the suite's plug-in is registered
    declared = built_by(providers.factory_for(name))
    assert isinstance(declared, type)
    assert isinstance(vars(declared)["capabilities"], Capabilities)  # its own, not inherited
    assert providers.capabilities(name) is declared.capabilities


def test_the_provider_protocol_names_the_capabilities() -> None:
    class Undeclared:
        name = "undeclared"
        max_batch_size = 1
        idempotency_window = None

        async def send(self, email: Any) -> Any: ...

        async def send_batch(self, emails: Any) -> Any: ...

        async def aclose(self) -> None: ...

    assert "capabilities" in Provider.__annotations__
    assert not isinstance(Undeclared(), Provider)
    assert isinstance(MemoryProvider(), Provider)


def test_a_plug_in_that_declares_nothing_gets_the_conservative_defaults() -> None:
    """No UTF-8 local parts (only SMTPUTF8 carries them), and no limits of its own; an
    unknown provider name gets the same."""

    class Plain:
        name = "plain-plug-in"

    def factory(settings: Any) -> Plain:
        return Plain()

    providers.register("plain-plug-in")(factory)  # type: ignore[arg-type]
    try:
        assert providers.capabilities("plain-plug-in") == Capabilities()
        settings = Settings(provider="plain-plug-in")
        assert intake.address_rules(settings).utf8_local_part is False
        limits = intake.limits(settings)
        assert (limits.max_reply_to, limits.attachment_extensions) == (None, None)
    finally:
        del providers._registry["plain-plug-in"]
    assert providers.capabilities("no-such-provider") == Capabilities()


def test_intakes_rules_come_from_the_settings_and_the_providers_declaration() -> None:
    unset = {"allow_test_domains": None}  # as a deployment that does not set it
    brevo = intake.Rules.of(Settings(provider="brevo", max_recipients=7, max_attempts=3, **unset))
    assert brevo.address_rules.utf8_local_part is False
    assert brevo.address_rules.allow_test_domains is False  # brevo sends for real
    assert (brevo.limits.max_recipients, brevo.limits.max_reply_to) == (7, 1)
    assert brevo.max_attempts == 3 and "welcome" in brevo.catalog.names()
    local = intake.Rules.of(Settings(provider="file", **unset))
    assert local.address_rules.utf8_local_part is True
    assert local.address_rules.allow_test_domains is True  # nothing leaves the machine


# --- new_message ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("send_at", "expires_at", "naive"),
    [
        (datetime(2030, 1, 1), datetime(2030, 1, 2, tzinfo=UTC), "send_at"),
        (datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 1, 2), "expires_at"),
    ],
)
def test_a_naive_time_beside_an_aware_one_is_refused_not_a_crash(
    send_at: datetime, expires_at: datetime, naive: str
) -> None:
    with pytest.raises(mailbag.InvalidMessage) as refused:
        mailbag.new_message(
            to="ada@example.com", subject="a", text="a", send_at=send_at, expires_at=expires_at
        )
    assert refused.value.errors == {naive: "must carry a time zone"}
