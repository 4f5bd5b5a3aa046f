"""`mailbag enqueue` with everything a message can carry, and `mailbag tenants senders`, on
each database: what is written, and bad input refused with nothing written."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from mailbag.cli import app
from mailbag.store import messages as message_store
from mailbag.store.schema import attachments, message_attachments, outbox_messages
from mailbag.store.session import Database

from conftest import TestDB

runner = CliRunner()
PDF = b"%PDF-1.4\n" + bytes(range(256)) * 8 + b"\n%%EOF\n"


@pytest.fixture
def cli(db, monkeypatch):
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)

    def invoke(*args: str):
        return runner.invoke(app, list(args))

    assert invoke("migrate").exit_code == 0
    return invoke


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "invoice.pdf").write_bytes(PDF)
    (tmp_path / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 50)
    (tmp_path / "body.html").write_text('<p><img src="cid:logo"> Grüße, your invoice.</p>')
    (tmp_path / "body.txt").write_text("Grüße, your invoice.\n")
    return tmp_path


def counts(db: TestDB) -> tuple[int, int, int]:
    with db.engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (outbox_messages, attachments, message_attachments)
        )


def stored(db: TestDB, message_id: str) -> Any:
    with Database(db.engine).connect() as session:
        return session.run(message_store.get(uuid.UUID(message_id)))


def test_enqueue_writes_the_message_with_its_attachments(cli, db, files):
    assert cli("tenants", "senders", "add", "default", "billing@acme.example").exit_code == 0
    result = cli(
        "enqueue",
        "--to", "ada@example.com",
        "--to", "charles@example.com",
        "--cc", "accounts@example.com",
        "--bcc", "archive@example.com",
        "--bcc", "audit@example.com",
        "--reply-to", "support@acme.example",
        "--from", "billing@acme.example",
        "--from-name", "Acme Billing",
        "--subject", "Your invoice",
        "--html", str(files / "body.html"),
        "--text", str(files / "body.txt"),
        "--attach", str(files / "invoice.pdf"),
        "--attach", f"{files / 'logo.png'};cid=logo",
        "--expires-in", "2h",
        "--priority", "high",
        "--unsubscribe-url", "https://acme.example/u/1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    message = stored(db, result.stdout.strip())
    recipients = message.all_recipients
    assert [a.address for a in recipients.to] == ["ada@example.com", "charles@example.com"]
    assert [a.address for a in recipients.cc] == ["accounts@example.com"]
    assert [a.address for a in recipients.bcc] == ["archive@example.com", "audit@example.com"]
    assert [a.address for a in message.reply_to] == ["support@acme.example"]
    assert (message.from_address, message.from_name) == ("billing@acme.example", "Acme Billing")
    assert message.template_name is None and message.subject == "Your invoice"
    assert "Grüße" in message.html and message.text == "Grüße, your invoice.\n"
    assert [(a.filename, a.content_type, a.content_id) for a in message.attachments] == [
        ("invoice.pdf", "application/pdf", None),
        ("logo.png", "image/png", "logo"),
    ]
    assert message.attachments[0].sha256 == hashlib.sha256(PDF).hexdigest()
    assert message.priority == 1 and message.unsubscribe_url == "https://acme.example/u/1"
    left = message.expires_at - datetime.now(UTC)
    assert timedelta(hours=1, minutes=58) < left <= timedelta(hours=2)
    assert counts(db) == (1, 2, 2)
    with db.engine.connect() as conn:
        content = conn.execute(select(attachments.c.content).where(
            attachments.c.sha256 == hashlib.sha256(PDF).hexdigest()
        )).scalar_one()  # fmt: skip
    assert bytes(content) == PDF


def test_an_explicit_content_type_wins_over_the_guess(cli, db, files):
    result = cli(
        "enqueue", "--to", "a@example.com", "--subject", "s", "--text", str(files / "body.txt"),
        "--attach", f"{files / 'invoice.pdf'};type=application/x-custom",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (ref,) = stored(db, result.stdout.strip()).attachments
    assert ref.content_type == "application/x-custom"


BAD = {
    "a missing file": (["--attach", "{dir}/nope.pdf"], "nope.pdf: No such file"),
    "a missing html file": (["--html", "@{dir}/nope.html"], "nope.html: No such file"),
    "a file over the limit": (["--attach", "{dir}/invoice.pdf"], "the limit for one attachment"),
    "an unknown from": (["--from", "ceo@acme.example"], "not a sender identity of tenant"),
    "a cid: with no attachment": (["--html", "{dir}/body.html"], "no attachment has"),
    "a bad attach option": (["--attach", "{dir}/invoice.pdf;kind=x"], "FILE;type=MIME/TYPE"),
    "a bad expiry": (["--expires-in", "soon"], "not a length of time like"),
    "a bad priority": (["--priority", "urgent"], "high, normal or low"),
    "51 recipients": (
        [arg for i in range(50) for arg in ("--cc", f"c{i}@example.com")],
        "the limit is 50",
    ),
    "template and html together": (
        ["--template", "welcome", "--html", "{dir}/body.txt"],
        "not both",
    ),
    "http unsubscribe": (["--unsubscribe-url", "http://acme.example/u"], "https://"),
}


@pytest.mark.parametrize(("args", "complaint"), BAD.values(), ids=BAD.keys())
def test_bad_input_exits_non_zero_and_writes_nothing(cli, db, files, monkeypatch, args, complaint):
    monkeypatch.setenv("MAILBAG_MAX_ATTACHMENT_BYTES", "1024")  # the PDF is larger
    base = ["--to", "a@example.com", "--subject", "s", "--text", str(files / "body.txt")]
    result = cli("enqueue", *base, *[a.replace("{dir}", str(files)) for a in args])
    assert result.exit_code == 2, result.output
    assert complaint in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert counts(db) == (0, 0, 0)


def test_senders_add_list_remove(cli, db):
    created = cli("tenants", "create", "acme")
    assert created.exit_code == 0, created.output
    tenant_id = created.stderr.split()[1]
    added = cli("tenants", "senders", "add", "acme", "billing@acme.example", "--name", "Billing")
    assert added.exit_code == 0, added.output
    assert f"{tenant_id} may send from billing@acme.example" in added.stdout
    again = cli("tenants", "senders", "add", tenant_id, "billing@acme.example")
    assert again.exit_code == 0 and "already" in again.stdout
    listed = cli("tenants", "senders", "list", tenant_id)
    assert listed.stdout.startswith("billing@acme.example\tBilling\t"), listed.output
    sent = cli(
        "enqueue", "--tenant", tenant_id, "--to", "a@example.com", "--from",
        "billing@acme.example", "--subject", "s", "--html", "/dev/null",
    )  # fmt: skip
    assert sent.exit_code == 2 and "must not be blank" in sent.stderr  # an empty file
    assert cli("tenants", "senders", "remove", "acme", "billing@acme.example").exit_code == 0
    gone = cli("tenants", "senders", "remove", "acme", "billing@acme.example")
    assert gone.exit_code == 1 and "is not a sender identity" in gone.stderr
    assert cli("tenants", "senders", "list", "acme").stdout == ""
    unknown = cli("tenants", "senders", "add", "nobody", "a@acme.example")
    assert unknown.exit_code == 2 and "no tenant 'nobody'" in unknown.stderr
    invalid = cli("tenants", "senders", "add", "acme", "not-an-address")
    assert invalid.exit_code == 2 and "not a valid email address" in invalid.stderr
