"""What a message can carry, end to end on each database: enqueued through the Python API,
sent by the worker with the SMTP provider, checked at a real SMTP server (aiosmtpd).

- recipients: two To, a Cc and a Bcc all in the envelope, the Bcc in no header;
- a ready-made HTML body with an inline image (cid:) and a PDF, bytes identical;
- a message past its expires_at ends `expired`, its event and metric written, and the
  server never hears of it;
- a high-priority message enqueued after normal ones is sent before them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from typing import Any

import pytest
from prometheus_client import REGISTRY

import mailbag
from mailbag.domain.content import Attachment
from mailbag.domain.states import Status
from mailbag.providers.smtp import SMTPProvider
from mailbag.settings import Settings
from mailbag.templates import builtin
from mailbag.worker import Worker, WorkerConfig

from conftest import TestDB
from helpers import events, get, run_worker_until, status_counts
from smtp_server import ReceivedMessage, RecordingSMTPServer

# A PDF's bytes as they are, binary ones included (a lossy encoding would show).
PDF = (
    b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
    b"2 0 obj<</Type/Pages/Kids[]/Count 0>>endobj\n" + bytes(range(256)) + b"\n%%EOF\n"
)
# The smallest PNG: one transparent pixel.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)
TO = [{"address": "ada@example.com", "name": "Ada Lovelace"}, "grace@example.com"]
CC, BCC, REPLY_TO = "carol@example.com", "hidden@example.com", "support@example.com"
HTML = '<h1>Your invoice</h1><p>Attached.</p><img src="cid:logo" alt="logo">'


@pytest.fixture
def smtp() -> Iterator[RecordingSMTPServer]:
    with RecordingSMTPServer() as server:
        yield server


@pytest.fixture
async def provider(smtp: RecordingSMTPServer) -> AsyncIterator[SMTPProvider]:
    settings = Settings(
        provider="smtp",
        smtp_host=smtp.host,
        smtp_port=smtp.port,
        smtp_tls="none",
        smtp_timeout=5.0,
    )
    made = SMTPProvider.from_settings(settings)
    yield made
    await made.aclose()


def worker(async_engine: Any, provider: SMTPProvider, **config: Any) -> Worker:
    config.setdefault("poll_interval", 0.05)
    config.setdefault("sweep_every", 0.05)
    return Worker(
        engine=async_engine,
        provider=provider,
        catalog=builtin(),
        config=WorkerConfig(worker_id="content-worker", from_email="billing@acme.test", **config),
    )


def enqueue(db: TestDB, **fields: Any) -> Any:
    """One message through the public Python API, in a transaction of the caller's."""
    with db.engine.begin() as conn:
        return mailbag.enqueue(conn, **fields).message.id


def ended(db: TestDB, *states: Status, total: int) -> Any:
    return lambda: sum(status_counts(db).get(s.value, 0) for s in states) == total


def parsed(received: ReceivedMessage) -> EmailMessage:
    message = BytesParser(policy=policy.default).parsebytes(received.raw)
    assert isinstance(message, EmailMessage)
    return message


def expired_count() -> float:
    labels = {"provider": "smtp", "template": "(ready-made)"}
    return REGISTRY.get_sample_value("mailbag_messages_expired_total", labels) or 0.0


async def test_every_recipient_attachment_and_inline_image_arrives_and_bcc_stays_hidden(
    db, async_engine, smtp, provider
):
    mid = enqueue(
        db,
        to=TO,
        cc=[CC],
        bcc=[BCC],
        reply_to=REPLY_TO,
        subject="Your invoice",
        html=HTML,
        attachments=[
            Attachment("invoice.pdf", "application/pdf", PDF, None),
            Attachment("logo.png", "image/png", PNG, "logo"),
        ],
    )
    await run_worker_until(worker(async_engine, provider), ended(db, Status.SENT, total=1))

    (received,) = smtp.accepted
    assert sorted(received.rcpt_tos) == sorted(["ada@example.com", "grace@example.com", CC, BCC])
    assert BCC.encode() not in received.raw  # in no header, nowhere in the content
    email = parsed(received)
    assert "Bcc" not in email
    assert [a.addr_spec for a in email["To"].addresses] == ["ada@example.com", "grace@example.com"]
    assert email["To"].addresses[0].display_name == "Ada Lovelace"
    assert email["Cc"].addresses[0].addr_spec == CC
    assert email["Reply-To"].addresses[0].addr_spec == REPLY_TO
    assert email["Subject"] == "Your invoice"

    (pdf,) = [part for part in email.iter_attachments() if part.get_filename() == "invoice.pdf"]
    assert pdf.get_content_type() == "application/pdf" and pdf.get_content() == PDF
    html = email.get_body(("html",))
    assert html is not None and 'src="cid:logo"' in html.get_content()
    (image,) = [part for part in email.walk() if part.get_content_type() == "image/png"]
    assert image["Content-ID"] == "<logo>"  # what cid:logo resolves to
    assert image.get_content() == PNG
    text = email.get_body(("plain",))
    assert text is not None and "Your invoice" in text.get_content()  # made from the HTML

    row = get(db, mid)
    assert row.status == Status.SENT and row.provider == "smtp"


async def test_a_message_past_its_expiry_ends_expired_without_reaching_the_server(
    db, async_engine, smtp, provider
):
    before = expired_count()
    expires_at = datetime.now(UTC) - timedelta(minutes=1)
    mid = enqueue(
        db, to="late@example.com", subject="Sale ends today", text="Hurry", expires_at=expires_at
    )
    await run_worker_until(worker(async_engine, provider), ended(db, Status.EXPIRED, total=1))

    assert smtp.arrived == [] and smtp.connections_opened == 0
    row = get(db, mid)
    assert (row.status, row.attempt_count, row.provider_message_id) == (Status.EXPIRED, 0, None)
    last = events(db, mid)[-1]
    assert (last.from_status, last.to_status) == ("processing", "expired")
    assert last.detail.startswith("expired before it could be sent (expires_at ")
    assert expired_count() - before == 1


async def test_a_high_priority_message_is_sent_before_the_normal_ones_due_before_it(
    db, async_engine, smtp, provider
):
    def send(to: str, priority: str) -> None:
        enqueue(db, to=to, subject=f"{priority} for {to}", text="hello", priority=priority)

    send("low@example.com", "low")
    normal = [f"normal{i}@example.com" for i in range(5)]
    for to in normal:
        send(to, "normal")
    send("urgent@example.com", "high")
    one_at_a_time = worker(async_engine, provider, batch_size=1, concurrency=1)
    await run_worker_until(one_at_a_time, ended(db, Status.SENT, total=7))
    order = ["urgent@example.com", *normal, "low@example.com"]
    assert [m.rcpt_tos for m in smtp.accepted] == [(to,) for to in order]
