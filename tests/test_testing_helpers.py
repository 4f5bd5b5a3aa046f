"""mailbag.testing: enqueue in your transaction, deliver_all runs the real worker with the
capture provider until nothing is due, and the captured emails are what would have left;
failures say which message and why (issue 12)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine

import mailbag
from api_helpers import settings_for
from mailbag import providers, runtime
from mailbag.domain.delivery import Deferred, Rejected
from mailbag.settings import Settings
from mailbag.testing import (
    CaptureProvider,
    RespondFailed,
    SentEmail,
    Undelivered,
    capture,
    deliver_all,
    deliver_all_async,
    mailbag_outbox,  # noqa: F401 (the fixture, imported as users do)
    migrate,
)

from helpers import LOGO_CID, check_full_delivery, claim, get, outgoing_email, tiny_pdf, tiny_png

SERVERS = ["sqlite", "postgresql", "mysql"]


def full_message(conn, **fields):
    """Ready-made, with every kind of recipient, a PDF, an inline image and a header."""
    values = {
        "to": [mailbag.Address("ann@example.org", "Ann Ångström"), "bob@example.org"],
        "cc": [mailbag.Address("carol@example.org", "Carol, CFO")],
        "bcc": ["dave.hidden@example.org"],
        "reply_to": mailbag.Address("help@example.org", "Help Desk"),
        "subject": "Your invoice",
        "html": f'<p>Invoice <b>42</b></p><img src="cid:{LOGO_CID}" alt="logo">',
        "text": "Invoice 42",
        "attachments": [
            mailbag.Attachment("Rechnung März.pdf", "application/pdf", tiny_pdf()),
            mailbag.Attachment("logo.png", "image/png", tiny_png(), LOGO_CID),
        ],
        "headers": {"X-Order": "42"},
        **fields,
    }
    return mailbag.enqueue(conn, **values).message


@pytest.mark.parametrize("db", SERVERS, indirect=True)
def test_a_ready_made_email_with_attachments_is_captured_whole(db):
    with db.engine.begin() as conn:
        message = full_message(conn)

    outbox = deliver_all(db.engine, settings=settings_for(db))

    (email,) = outbox
    assert email.message_id == message.id
    assert email.to == ["ann@example.org", "bob@example.org"]
    assert email.cc == ["carol@example.org"]
    assert email.bcc == ["dave.hidden@example.org"]
    assert email.recipients == [*email.to, *email.cc, *email.bcc]
    assert email.reply_to == ["help@example.org"]
    assert email.subject == "Your invoice"
    assert email.text == "Invoice 42"
    assert "<b>42</b>" in email.html
    assert email.headers == {"X-Order": "42"}
    assert [(a.filename, a.content_type, a.content) for a in email.attachments] == [
        ("Rechnung März.pdf", "application/pdf", tiny_pdf()),
        ("logo.png", "image/png", tiny_png()),
    ]
    # The raw MIME is the one a server would receive: no Bcc in it, attachments intact.
    check_full_delivery(email.raw, email.email)
    assert email.mime["X-Order"] == "42"
    assert email.mime["Subject"] == "Your invoice"
    assert outbox.to("CAROL@example.org") == [email]
    assert outbox.to("nobody@example.org") == []
    # The real worker ran: the message is sent in the database, by the capture provider.
    stored = get(db, message.id)
    assert stored.status == mailbag.Status.SENT
    assert stored.provider == "capture"
    assert deliver_all(db.engine, settings=settings_for(db)) == []  # nothing left to send


@pytest.mark.parametrize("db", SERVERS, indirect=True)
def test_templated_emails_are_rendered_and_a_rolled_back_one_never_leaves(
    db,
    mailbag_outbox,  # noqa: F811 (the imported fixture)
):
    with db.engine.begin() as conn:
        for name in ("Ada", "Grace", "Edsger"):
            mailbag.enqueue(
                conn, to=f"{name.lower()}@example.org", template="welcome", data={"name": name}
            )
    with db.engine.connect() as conn, conn.begin() as transaction:
        mailbag.enqueue(conn, to="ghost@example.org", subject="Never", text="sent")
        transaction.rollback()

    outbox = deliver_all(db.url, settings=settings_for(db))

    assert sorted(email.to[0] for email in outbox) == [
        "ada@example.org",
        "edsger@example.org",
        "grace@example.org",
    ]
    (ada,) = outbox.to("ada@example.org")
    assert ada.subject == "Welcome to mailbag, Ada"
    assert ada.text.startswith("Hello Ada,")
    assert "<p>Hello Ada,</p>" in ada.html
    assert ada.attachments == []
    # The fixture saw the same emails.
    assert list(mailbag_outbox) == list(outbox)


def receipt_templates(folder: Path) -> Path:
    """A TEMPLATES_DIR with a `receipt` template the built-in catalog does not have."""
    for part, content in (
        ("subject.txt", "Receipt"),
        ("body.txt", "Paid."),
        ("body.html", "<p>Paid.</p>"),
    ):
        (folder / "receipt").mkdir(exist_ok=True)
        (folder / "receipt" / part).write_text(content)
    return folder


@pytest.mark.parametrize("db", SERVERS, indirect=True)
def test_a_message_that_cannot_be_sent_is_named_with_its_reason(db, tmp_path):
    # The application enqueues with templates the worker does not have: it fails at send.
    app = settings_for(db, templates_dir=receipt_templates(tmp_path))
    with db.engine.begin() as conn:
        good = mailbag.enqueue(conn, to="ok@example.org", subject="Fine", text="fine").message
        bad = mailbag.enqueue(conn, to="bad@example.org", template="receipt", settings=app).message

    with pytest.raises(Undelivered) as raised:
        deliver_all(db.engine, settings=settings_for(db))

    (failure,) = raised.value.failures
    assert failure.message_id == bad.id
    assert failure.to == "bad@example.org"
    assert failure.status == "failed"
    assert "unknown template 'receipt'" in (failure.error or "")
    assert str(bad.id) in str(raised.value) and "receipt" in str(raised.value)
    # What could be sent was sent, and is in the exception too.
    assert [email.message_id for email in raised.value.outbox] == [good.id]
    assert get(db, good.id).status == mailbag.Status.SENT


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_the_provider_can_be_told_to_refuse_or_defer(db):
    with db.engine.begin() as conn:
        for to in ("ok@example.org", "refused@example.org", "later@example.org"):
            mailbag.enqueue(conn, to=to, subject="Hi", text="hi")

    def respond(email):
        assert isinstance(email, SentEmail)  # what deliver_all returns, as documented
        if email.to == ["refused@example.org"]:
            return Rejected("550 no such user")
        if email.to == ["later@example.org"]:
            return Deferred("421 try again later")
        return None

    settings = settings_for(db)
    with pytest.raises(Undelivered) as raised:
        deliver_all(db.engine, settings=settings, respond=respond)
    found = {f.to: (f.status, f.error) for f in raised.value.failures}
    assert found == {
        "refused@example.org": ("failed", "550 no such user"),
        "later@example.org": ("retrying", "421 try again later"),
    }
    assert [email.to for email in raised.value.outbox] == [["ok@example.org"]]

    # check=False: the outcome is left for the test to look at.
    later = datetime.now(UTC) + timedelta(hours=1)
    retried = deliver_all(db.engine, settings=settings, at=later, check=False)
    assert [email.to for email in retried] == [["later@example.org"]]


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_respond_is_given_what_the_docs_say_a_sent_email_with_its_fields(db):
    with db.engine.begin() as conn:
        full_message(conn)
    seen = []

    def respond(email):
        seen.append((email.to, email.cc, email.subject, [a.filename for a in email.attachments]))
        return Rejected("552 too big") if email.attachments else None

    with pytest.raises(Undelivered):
        deliver_all(db.engine, settings=settings_for(db), respond=respond)
    assert seen == [
        (
            ["ann@example.org", "bob@example.org"],
            ["carol@example.org"],
            "Your invoice",
            ["Rechnung März.pdf", "logo.png"],
        )
    ]


@pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)
def test_a_respond_that_raises_fails_the_run_with_its_own_exception(db):
    with db.engine.begin() as conn:
        first = mailbag.enqueue(conn, to="ada@example.org", subject="One", text="1").message
        second = mailbag.enqueue(conn, to="bob@example.org", subject="Two", text="2").message

    def respond(email):
        return {"ada@example.org": None}[email.to[0]]  # a bug in the test: KeyError for bob

    with pytest.raises(RespondFailed) as raised:
        deliver_all(db.engine, settings=settings_for(db), respond=respond)
    failed = raised.value
    assert isinstance(failed.__cause__, KeyError) and failed.__cause__.args == ("bob@example.org",)
    assert failed.email.message_id == second.id
    assert str(second.id) in str(failed) and "bob@example.org" in str(failed)
    # Neither message became unknown: one was sent, the other is deferred for a retry.
    assert get(db, first.id).status == mailbag.Status.SENT
    assert get(db, second.id).status == mailbag.Status.RETRYING

    # A broken test is never a result to look at, check=False or not.
    later = datetime.now(UTC) + timedelta(days=2)
    with pytest.raises(RespondFailed):
        deliver_all(db.engine, settings=settings_for(db), respond=respond, at=later, check=False)
    assert get(db, second.id).status == mailbag.Status.RETRYING
    (again,) = deliver_all(db.engine, settings=settings_for(db), at=later + timedelta(days=2))
    assert again.message_id == second.id


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_scheduled_email_waits_for_its_time(db):
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    with db.engine.begin() as conn:
        mailbag.enqueue(conn, to="ada@example.org", subject="Later", text="x", send_at=tomorrow)
    settings = settings_for(db)
    assert deliver_all(db.engine, settings=settings) == []
    (email,) = deliver_all(db.engine, settings=settings, at=tomorrow + timedelta(minutes=1))
    assert email.subject == "Later"


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_message_held_by_another_worker_times_out_clearly(db):
    with db.engine.begin() as conn:
        message = mailbag.enqueue(conn, to="ada@example.org", subject="Hi", text="hi").message
    now = datetime.now(UTC)
    assert [m.id for m in claim(db, now=now, worker="elsewhere").messages] == [message.id]

    with pytest.raises(
        TimeoutError, match=rf"1 message\(s\) still due .*{message.id} \(processing\)"
    ):
        deliver_all(db.engine, settings=settings_for(db), timeout=0.5)


def test_an_unmigrated_or_in_memory_database_is_refused_clearly(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    create_engine(url).connect().close()  # the file exists, without mailbag's tables
    with pytest.raises(runtime.SchemaNotCurrent, match=r"mailbag\.testing\.migrate\(engine\)"):
        deliver_all(url)
    migrate(url)
    assert deliver_all(url) == []
    with pytest.raises(ValueError, match="in-memory SQLite"):
        deliver_all("sqlite://")
    with pytest.raises(ValueError, match="in-memory SQLite"):
        migrate(create_engine("sqlite:///:memory:"))


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_without_a_secret_key_on_a_server_ordinary_emails_still_go(db):
    keyless = Settings.model_validate({"database_url": db.url, "log_level": "WARNING"})
    with db.engine.begin() as conn:
        mailbag.enqueue(conn, to="ada@example.org", subject="Hi", text="hi")
    (email,) = deliver_all(db.engine, settings=keyless)
    assert email.to == ["ada@example.org"]


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_the_async_twin_and_the_loop_guard(db):
    with db.engine.begin() as conn:
        mailbag.enqueue(conn, to="ada@example.org", subject="Async", text="hi")
    with pytest.raises(RuntimeError, match="deliver_all_async"):
        deliver_all(db.engine, settings=settings_for(db))
    engine = db.async_engine()
    try:
        (email,) = await deliver_all_async(engine, settings=settings_for(db))
    finally:
        await engine.dispose()
    assert email.subject == "Async"


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_provider_capture_is_registered_for_a_worker_built_from_settings(db):
    """MAILBAG_PROVIDER=capture: a worker built by runtime.build_worker records into
    capture(), and outside one nothing is kept."""
    settings = settings_for(db, provider="capture")
    assert "capture" in providers.available()
    assert isinstance(providers.create("capture", settings), CaptureProvider)
    with db.engine.begin() as conn:
        mailbag.enqueue(conn, to="ada@example.org", subject="From settings", text="hi")
        mailbag.enqueue(conn, to="grace@example.org", subject="Unwatched", text="hi")
    engine = runtime.worker_engine(settings)
    worker = runtime.build_worker(settings, engine)
    assert isinstance(worker.provider, CaptureProvider)
    with capture() as outer, capture() as inner:
        await worker.provider.send(outgoing_email())
    assert len(inner) == len(outer) == 1  # every active capture records it
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    with capture() as outbox:
        async with asyncio.timeout(15):
            while len(outbox) < 2:
                await asyncio.sleep(0.02)
    stop.set()
    await task
    await engine.dispose()
    assert sorted(email.subject for email in outbox) == ["From settings", "Unwatched"]
    assert len(inner) == 1  # closed captures record nothing more


# --- the documented example (docs/testing.md), run as a user would run it ---------------------


def readme_example() -> str:
    """docs/testing.md's example test, as a user copies it."""
    readme = (Path(__file__).resolve().parent.parent / "docs" / "testing.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "deliver_all(" in b]
    return block


README_EXAMPLE = readme_example()

README_FIXTURE_EXAMPLE = """\
from mailbag.testing import mailbag_outbox  # noqa: F401 (a pytest fixture)
"""


def test_the_readme_example_passes_in_a_project_of_its_own(tmp_path):
    (tmp_path / "test_signup.py").write_text(README_EXAMPLE)
    failing = README_EXAMPLE.replace('data={"name": "Ada"}', 'data={"name": "Bob"}')
    (tmp_path / "test_signup_wrong.py").write_text(failing)
    (tmp_path / "conftest.py").write_text(README_FIXTURE_EXAMPLE)
    (tmp_path / "test_fixture.py").write_text(
        textwrap.dedent(
            """\
            import mailbag
            from mailbag.testing import deliver_all, migrate
            from sqlalchemy import create_engine


            def test_the_fixture_sees_what_deliver_all_sent(tmp_path, mailbag_outbox):
                engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
                migrate(engine)
                with engine.begin() as conn:
                    mailbag.enqueue(conn, to="ada@example.org", subject="Hi", text="hi")
                deliver_all(engine)
                assert [e.subject for e in mailbag_outbox] == ["Hi"]
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAILBAG_", "PYTEST_"))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rN", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = result.stdout.strip().splitlines()[-1]
    assert "1 failed, 2 passed" in summary, result.stdout + result.stderr
    # The failing copy fails on the assertion about the email, not on the set-up.
    assert "Welcome to mailbag, Bob" in result.stdout
