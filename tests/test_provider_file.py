"""The development providers: file (.eml a person can open) and console."""

from __future__ import annotations

import email
import io
from email import policy

from mailbag.domain.delivery import Accepted
from mailbag.providers.console import ConsoleProvider
from mailbag.providers.file import FileProvider

from helpers import outgoing_email


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
