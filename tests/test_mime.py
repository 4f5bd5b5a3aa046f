"""The email as it leaves: user text sent literally, decoding back to exactly what was given.

Every provider that sends MIME (SMTP through a real server, SES's raw bytes, the file
provider's .eml) and Brevo's JSON carry subjects, display names and custom header values
unchanged, with no header added or lost -- whatever the text looks like, encoded-words
included. Decoding is checked twice: with the email package's parser (`policy.default`)
and with an RFC 2047 decoder (`email.header.decode_header`).
"""

from __future__ import annotations

import asyncio
import email.policy
import email.utils
import json
from collections.abc import Iterator
from email.header import decode_header, make_header
from email.parser import BytesParser
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mailbag.compose import NeedsSMTPUTF8, OutgoingEmail
from mailbag.domain.message import unsafe_text
from mailbag.providers.brevo import BrevoProvider, single_payload
from mailbag.providers.file import FileProvider
from mailbag.providers.ses import SESProvider
from mailbag.providers.smtp import SMTPProvider
from mailbag.settings import Settings

from brevo_server import BrevoServer
from brevo_server import _validate_send as validate_brevo_send
from helpers import outgoing_email
from smtp_server import RecordingSMTPServer

INJECTION = "=?utf-8?q?Hello=0D=0AX-Injected:_yes?="
BLANK_LINE_INJECTION = "=?utf-8?q?Hi=0D=0A=0D=0Abody?="
LOOKS_ENCODED = "=?utf-8?q?x?="
HEADER = "X-Custom"
# Every header we write, in order; a custom one goes after our own.
OWN_HEADERS = ["From", "To", "Subject", "Date", "Message-ID", "X-Mailbag-Message-ID"]
MIME_HEADERS = ["MIME-Version", "Content-Type"]


# --- reading an email back ---------------------------------------------------------------


def parsed(raw: bytes) -> email.message.EmailMessage:
    message: email.message.EmailMessage = BytesParser(policy=email.policy.default).parsebytes(raw)
    return message


def raw_header(raw: bytes, name: str) -> str:
    """The header's value as written, unfolded (RFC 5322: only the CRLF goes)."""
    head = raw.split(b"\r\n\r\n", 1)[0].decode("utf-8")
    lines = head.replace("\r\n ", " ").replace("\r\n\t", "\t").split("\r\n")
    found = [line.split(":", 1)[1] for line in lines if line.split(":", 1)[0] == name]
    assert len(found) == 1, (name, lines)
    return found[0].removeprefix(" ")


def rfc2047(value: str) -> str:
    return str(make_header(decode_header(value)))


def display_name(raw: bytes, name: str) -> str:
    """The display name of a mailbox header, decoded as RFC 2047 says (whitespace between
    adjacent encoded-words is not text; the email package's phrase parser keeps it)."""
    value = raw_header(raw, name)
    phrase = value.rpartition(" <")[0]
    if phrase.startswith('"'):
        return email.utils.parseaddr(value)[0]
    return rfc2047(phrase)


def check(raw: bytes, sent: OutgoingEmail) -> None:
    """`raw` carries exactly the email's text: each header decodes to the given value, by
    both decoders, and the headers are exactly ours plus the custom ones."""
    message = parsed(raw)
    assert list(message.keys()) == OWN_HEADERS + list(sent.headers) + MIME_HEADERS
    assert str(message["Subject"]) == sent.subject
    assert rfc2047(raw_header(raw, "Subject")) == sent.subject
    for name, value in sent.headers.items():
        assert str(message[name]) == value
        assert rfc2047(raw_header(raw, name)) == value
    assert display_name(raw, "To") == (sent.to_name or "")
    assert display_name(raw, "From") == (sent.from_name or "")
    if raw_header(raw, "To").startswith('"'):
        # A quoted-string: the email package's parser agrees. (Its phrase parser is not
        # RFC 2047's decoder for encoded-words: it collapses runs of whitespace inside them
        # and keeps the space between adjacent ones.)
        assert message["To"].addresses[0].display_name == sent.to_name
    assert message["To"].addresses[0].addr_spec == sent.to_email
    assert message["Message-ID"] == sent.rfc_message_id
    for subtype, body in (("plain", sent.text), ("html", sent.html)):
        part = message.get_body((subtype,))
        assert part is not None
        # Lines travel as CRLF (the canonical form of a text body).
        assert part.get_content().replace("\r\n", "\n") == body
    for line in raw.split(b"\r\n"):
        assert len(line) <= 998
        assert b"\r" not in line and b"\n" not in line


# --- the regressions the issue reported ---------------------------------------------------


@pytest.mark.parametrize("text", [INJECTION, BLANK_LINE_INJECTION])
def test_an_encoded_word_in_user_text_adds_no_header(text: str) -> None:
    sent = outgoing_email(1, subject=text, to_name=text, headers={HEADER: text})
    message = parsed(sent.raw)
    assert "X-Injected" not in message
    check(sent.raw, sent)


def test_text_that_merely_looks_encoded_is_sent_as_written() -> None:
    sent = outgoing_email(1, subject=LOOKS_ENCODED, to_name=LOOKS_ENCODED, headers={HEADER: "=?x"})
    check(sent.raw, sent)
    assert str(parsed(sent.raw)["Subject"]) == "=?utf-8?q?x?="


def test_a_long_subject_mixing_scripts_keeps_every_space() -> None:
    # The email package's folder lost the space in "Ünïcödé résumé" (the third line).
    subject = (
        "ascii Ünïcödé plain ascii plain Grüße x x résumé naïve résumé plain Ünïcödé résumé "
        "Grüße naïve und hello München x résumé München aus naïve x naïve 東京 Grüße hello aus"
    )
    sent = outgoing_email(1, subject=subject, to_name="Zoë " * 30)
    check(sent.raw, sent)
    assert rfc2047(raw_header(sent.raw, "Subject")) == subject


def test_plain_ascii_stays_readable_and_is_folded_within_78_characters() -> None:
    subject = "Your order 1234 has shipped and will arrive " * 4
    sent = outgoing_email(1, subject=subject.strip(), to_name='Ada "the first" Lovelace')
    head = sent.raw.split(b"\r\n\r\n", 1)[0]
    assert b"Subject: Your order 1234 has shipped" in head
    assert b'To: "Ada \\"the first\\" Lovelace" <user1@example.com>' in head
    assert all(len(line) <= 78 for line in head.split(b"\r\n"))
    check(sent.raw, sent)


def test_structured_headers_go_out_in_the_wire_form_given() -> None:
    value = "<https://example.com/unsubscribe?u=1>, <mailto:leave@example.com>"
    sent = outgoing_email(1, headers={"List-Unsubscribe": value, "Reply-To": "=?x?= <a@b.c>"})
    assert raw_header(sent.raw, "List-Unsubscribe") == value  # folded, not encoded
    assert b"Reply-To: =?x?= <a@b.c>\r\n" in sent.raw


def test_an_idn_domain_is_written_in_punycode_and_a_utf8_local_part_needs_smtputf8() -> None:
    sent = outgoing_email(1, to_email="zoë@bücher.example")
    assert sent.needs_smtputf8
    with pytest.raises(NeedsSMTPUTF8):
        _ = sent.raw
    assert 'To: "User 1" <zoë@xn--bcher-kva.example>'.encode() in sent.raw_utf8
    idn = outgoing_email(1, to_email="user@bücher.example")
    assert b"<user@xn--bcher-kva.example>" in idn.raw and not idn.needs_smtputf8


def test_the_bytes_are_the_same_every_time_they_are_built() -> None:
    sent = outgoing_email(1, subject="Grüße")
    again = OutgoingEmail(**{k: getattr(sent, k) for k in sent.__dataclass_fields__})
    assert sent.raw == again.raw


# --- round trips through every provider -------------------------------------------------

# Anything validation lets through (see domain.message.unsafe_text): all of Unicode but
# line breaks, other controls and lone surrogates; tab is allowed.
CHARS = st.characters(blacklist_categories=("Cc", "Cs")).filter(
    lambda ch: unsafe_text(ch) is None
) | st.just("\t")
# Runs of text that look like encoded-words, folding points and quoting trouble.
TRICKY = st.sampled_from(
    [INJECTION, LOOKS_ENCODED, "=?", "?=", " ", "  ", '"', "\\", "<a@b.c>", "_", "=", ",", ";"]
)
TEXT = st.lists(st.text(CHARS, min_size=1, max_size=20) | TRICKY, min_size=1, max_size=12).map(
    "".join
)


def subjects() -> st.SearchStrategy[str]:
    return TEXT.filter(lambda s: bool(s.strip()))


@st.composite
def emails(draw: st.DrawFn) -> OutgoingEmail:
    name = draw(st.none() | TEXT)
    return outgoing_email(  # type: ignore[no-any-return]
        1,
        subject=draw(subjects()),
        to_name=name,
        from_name=draw(st.none() | TEXT),
        headers={HEADER: draw(st.text(max_size=0) | TEXT), "X-Other": draw(TEXT)},
        text=draw(st.text(CHARS | st.just("\n"), max_size=200)),
        html=draw(st.text(CHARS | st.just("\n"), min_size=1, max_size=200)),
    )


ROUND_TRIP = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@ROUND_TRIP
@given(emails())
def test_ses_raw_mime_and_the_file_providers_eml_round_trip_exactly(
    tmp_path_factory: pytest.TempPathFactory, sent: OutgoingEmail
) -> None:
    check(sent.raw, sent)
    # SES: the request's raw message is those bytes.
    request = SESProvider.from_settings(Settings(provider="ses", concurrency=1))._request(sent)
    assert request["Content"]["Raw"]["Data"] == sent.raw
    # file: the .eml on disk, in local line endings.
    provider = FileProvider(tmp_path_factory.mktemp("mail"))
    asyncio.run(provider.send(sent))
    check(provider.path_for(sent).read_bytes().replace(b"\n", b"\r\n"), sent)


@pytest.fixture(scope="module")
def smtp_server() -> Iterator[RecordingSMTPServer]:
    with RecordingSMTPServer() as server:
        yield server


@settings(ROUND_TRIP, max_examples=25)
@given(emails())
def test_smtp_delivers_mime_that_round_trips(
    smtp_server: RecordingSMTPServer, sent: OutgoingEmail
) -> None:
    settings_ = Settings(
        provider="smtp", smtp_host=smtp_server.host, smtp_port=smtp_server.port, smtp_tls="none"
    )

    async def send() -> Any:
        provider = SMTPProvider.from_settings(settings_)
        try:
            return await provider.send(sent)
        finally:
            await provider.aclose()

    before = len(smtp_server.arrived)
    outcome = asyncio.run(send())
    assert type(outcome).__name__ == "Accepted", outcome
    received = smtp_server.arrived[before]
    check(received.raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"), sent)


@pytest.fixture(scope="module")
def brevo() -> Iterator[BrevoServer]:
    with BrevoServer() as server:
        yield server


@settings(ROUND_TRIP, max_examples=12)  # each one an HTTP client and request
@given(emails())
def test_brevo_receives_every_field_exactly(brevo: BrevoServer, sent: OutgoingEmail) -> None:
    async def send() -> Any:
        provider = BrevoProvider(api_key=brevo.api_key, base_url=brevo.url)
        try:
            return await provider.send(sent)
        finally:
            await provider.aclose()

    outcome = asyncio.run(send())
    assert type(outcome).__name__ == "Accepted", outcome
    delivery = brevo.delivered()[-1]
    assert delivery.subject == sent.subject
    assert delivery.to == [
        {"email": sent.to_email, "name": sent.to_name} if sent.to_name else {"email": sent.to_email}
    ]
    assert delivery.sender.get("name") == (sent.from_name or None)
    assert delivery.html == sent.html
    assert {k: v for k, v in delivery.headers.items() if k in sent.headers} == dict(sent.headers)


def test_what_arrives_is_what_the_test_checks() -> None:
    """The checks above can fail: a header added or a subject changed is caught."""
    sent = outgoing_email(1, subject="Grüße")
    with pytest.raises(AssertionError):
        check(sent.raw.replace(b"MIME-Version", b"X-Extra: 1\r\nMIME-Version"), sent)
    with pytest.raises(AssertionError):
        check(sent.raw, outgoing_email(1, subject="Grüsse", message_id=sent.message_id))


@ROUND_TRIP
@given(emails())
def test_brevos_json_carries_every_field_exactly_and_fits_its_schema(sent: OutgoingEmail) -> None:
    body = json.loads(json.dumps(single_payload(sent)))
    (version,) = validate_brevo_send(body)  # raises where Brevo would answer 400
    assert body["subject"] == sent.subject
    assert version["to"][0].get("name") == (sent.to_name or None)
    assert body["sender"].get("name") == (sent.from_name or None)
    assert body["htmlContent"] == sent.html and body.get("textContent", "") == sent.text
    assert {k: v for k, v in body["headers"].items() if k in sent.headers} == dict(sent.headers)
