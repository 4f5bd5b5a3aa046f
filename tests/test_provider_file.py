"""The development providers: file (.eml a person can open) and console."""

from __future__ import annotations

import email
import io
import json
from email import policy

from mailbag.domain.delivery import Accepted
from mailbag.providers.console import ConsoleProvider
from mailbag.providers.file import FileProvider

from helpers import LOGO_CID, check_full_delivery, full_email, outgoing_email, tiny_pdf


async def test_the_file_provider_writes_a_readable_eml(tmp_path):
    provider = FileProvider(tmp_path / "mail")
    sent = outgoing_email(1, subject="Hello – ünïcode")
    outcome = await provider.send(sent)
    assert isinstance(outcome, Accepted)
    (path,) = (tmp_path / "mail").iterdir()
    assert path.name == f"{sent.message_id}.eml" == outcome.provider_message_id
    raw = path.read_bytes()
    assert b"\r\n" not in raw  # local line endings
    parsed = email.message_from_bytes(raw, policy=policy.default)
    assert parsed["Message-ID"] == sent.rfc_message_id
    assert parsed["Subject"] == "Hello – ünïcode"
    assert parsed.get_body(("plain",)).get_content().strip() == "Hello 1"
    # The same message again overwrites its one file: it is the same email.
    await provider.send(sent)
    assert len(list((tmp_path / "mail").iterdir())) == 1


async def test_an_unwritable_folder_is_a_retry_not_a_crash(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    outcome = await FileProvider(blocker).send(outgoing_email())
    assert type(outcome).__name__ == "Deferred"


async def test_the_console_provider_prints_the_email():
    out = io.StringIO()
    outcome = await ConsoleProvider(out).send(outgoing_email(2))
    assert isinstance(outcome, Accepted)
    assert "Subject: Hello 2" in out.getvalue() and "Hello 2" in out.getvalue()


async def test_the_file_provider_writes_the_envelope_beside_an_email_with_bcc(tmp_path):
    provider = FileProvider(tmp_path / "mail")
    sent = full_email(3)
    outcome = await provider.send(sent)
    assert isinstance(outcome, Accepted)
    assert sorted(p.name for p in (tmp_path / "mail").iterdir()) == sorted(
        [f"{sent.message_id}.eml", f"{sent.message_id}.envelope.json"]
    )
    raw = provider.path_for(sent).read_bytes()
    check_full_delivery(raw.replace(b"\n", b"\r\n"), sent)
    envelope = json.loads(provider.envelope_path_for(sent).read_text("utf-8"))
    assert envelope == {
        "mail_from": "sender@example.com",
        "rcpt_to": [
            "ann@example.com",
            "bob@example.com",
            "carol@example.com",
            "dave.hidden@example.com",
        ],
        "bcc": ["dave.hidden@example.com"],
    }


async def test_the_console_provider_prints_every_recipient_and_attachment():
    out = io.StringIO()
    sent = full_email(4)
    assert isinstance(await ConsoleProvider(out).send(sent), Accepted)
    printed = out.getvalue()
    assert "To: Ann Ångström <ann@example.com>, bob@example.com\n" in printed
    assert "Cc: Carol, CFO <carol@example.com>\n" in printed
    assert "Bcc (envelope only, in no header): Dave Hidden <dave.hidden@example.com>\n" in printed
    assert "Reply-To: Help Desk <help@example.com>\n" in printed
    assert "List-Unsubscribe: <https://example.com/unsubscribe?u=1>\n" in printed
    assert f"[attachment] Rechnung März.pdf (application/pdf, {len(tiny_pdf())} bytes)" in printed
    assert f"[inline, cid:{LOGO_CID}] logo.png (image/png" in printed
