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
import re
import uuid
from collections.abc import Iterator
from email.header import decode_header, make_header
from email.parser import BytesParser
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mailbag.compose import NeedsSMTPUTF8, OutgoingEmail, check_renders
from mailbag.domain.content import Address, Attachment, Recipients
from mailbag.domain.message import InvalidMessage, ascii_address, new_message, unsafe_text
from mailbag.providers.brevo import BrevoProvider, single_payload
from mailbag.providers.file import FileProvider
from mailbag.providers.ses import SESProvider
from mailbag.providers.smtp import SMTPProvider
from mailbag.settings import Settings

from brevo_server import BrevoServer
from brevo_server import _validate_send as validate_brevo_send
from helpers import LOGO_CID, check_full_delivery, full_email, outgoing_email, tiny_pdf
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


# One mailbox of a header as we write it: a phrase (quoted-strings, encoded-words) and
# <addr-spec>; neither an encoded-word nor our addr-spec holds "<" or ",".
MAILBOX = re.compile(r'\s*((?:"(?:[^"\\]|\\.)*"|[^"<,])*?)\s*<([^<>]*)>\s*(?:,|$)')


def display_names(raw: bytes, name: str) -> list[str]:
    """The display names of a mailbox header, decoded as RFC 2047 says (whitespace between
    adjacent encoded-words is not text; the email package's phrase parser keeps it)."""
    value = raw_header(raw, name)
    names = []
    for match in MAILBOX.finditer(value):
        phrase = match.group(1)
        if phrase.startswith('"'):
            names.append(email.utils.parseaddr(match.group(0).rstrip(","))[0])
        else:
            names.append(rfc2047(phrase) if phrase else "")
    assert "".join(m.group(0) for m in MAILBOX.finditer(value)) == value, value
    return names


def display_name(raw: bytes, name: str) -> str:
    (found,) = display_names(raw, name)
    return found


def own_headers(sent: OutgoingEmail) -> list[str]:
    names = ["From", "To"]
    names += ["Cc"] if sent.recipients.cc else []
    names += ["Reply-To"] if sent.reply_to else []
    names += ["Subject", "Date", "Message-ID", "X-Mailbag-Message-ID"]
    return names + list(sent.list_unsubscribe)


def check(raw: bytes, sent: OutgoingEmail) -> None:
    """`raw` carries exactly the email's text: each header decodes to the given value, by
    both decoders, and the headers are exactly ours plus the custom ones; every mailbox,
    attachment name and attachment byte comes back as given."""
    message = parsed(raw)
    assert list(message.keys()) == own_headers(sent) + list(sent.headers) + MIME_HEADERS
    assert str(message["Subject"]) == sent.subject
    assert rfc2047(raw_header(raw, "Subject")) == sent.subject
    for name, value in sent.headers.items():
        assert str(message[name]) == value
        assert rfc2047(raw_header(raw, name)) == value
    assert display_names(raw, "To") == [a.name or "" for a in sent.recipients.to]
    assert display_name(raw, "From") == (sent.from_name or "")
    if raw_header(raw, "To").startswith('"'):
        # A quoted-string: the email package's parser agrees. (Its phrase parser is not
        # RFC 2047's decoder for encoded-words: it collapses runs of whitespace inside them
        # and keeps the space between adjacent ones.)
        assert message["To"].addresses[0].display_name == sent.to_name
    assert message["To"].addresses[0].addr_spec == sent.to_email
    assert message["Message-ID"] == sent.rfc_message_id
    for header, mailboxes in (("Cc", sent.recipients.cc), ("Reply-To", sent.reply_to)):
        if mailboxes:
            assert display_names(raw, header) == [a.name or "" for a in mailboxes]
            assert [a.addr_spec for a in message[header].addresses] == [
                ascii_address(a.address)
                for a in mailboxes  # headers carry IDNA domains
            ]
    for subtype, body in (("plain", sent.text), ("html", sent.html)):
        part = message.get_body((subtype,))
        assert part is not None
        # Lines travel as CRLF (the canonical form of a text body).
        assert part.get_content().replace("\r\n", "\n") == body
    parts = [p for p in message.walk() if p.get_content_disposition() in ("attachment", "inline")]
    assert [(filename(p), p.get_content_type()) for p in parts] == [
        (a.filename, a.content_type) for a in sorted(sent.attachments, key=lambda a: not a.inline)
    ]
    assert [p.get_payload(decode=True) for p in parts] == [
        a.content for a in sorted(sent.attachments, key=lambda a: not a.inline)
    ]
    for line in raw.split(b"\r\n"):
        assert len(line) <= 998
        assert b"\r" not in line and b"\n" not in line
    check_boundaries(raw)


def filename(part: email.message.EmailMessage) -> str | None:
    """The attachment's filename parameter as written (`get_filename` strips whitespace)."""
    value = part.get_param("filename", header="content-disposition")
    if isinstance(value, tuple):  # RFC 2231: (charset, language, text)
        return email.utils.collapse_rfc2231_value(value)
    return value  # already unquoted (collapse_rfc2231_value would strip <...> too)


def check_boundaries(raw: bytes) -> None:
    """Each multipart level has its own boundary, none a prefix of another, and no line of
    content starts like a delimiter."""
    boundaries = re.findall(rb'boundary="([^"]+)"', raw)
    assert len(set(boundaries)) == len(boundaries)
    for a in boundaries:
        for b in boundaries:
            assert a == b or not b.startswith(a)
    for line in raw.split(b"\r\n"):
        if line.startswith(b"--"):
            assert any(line in (b"--" + b, b"--" + b + b"--") for b in boundaries), line


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


# --- what a message carries besides its text ----------------------------------------------

# The committed (before issue 11) composer's bytes for this plain templated email.
PLAIN_BEFORE = (
    b'From: "Sender" <sender@example.com>\r\nTo: =?utf-8?b?Wm/DqyDDhW5nc3Ryw7Zt?= <user7@e'
    b"xample.com>\r\nSubject: =?utf-8?q?Willkommen=2C_Zo=C3=AB_=E2=80=93_dein_Konto_ist_ber"
    b"eit?=\r\nDate: Thu, 01 Jan 2026 12:00:00 +0000\r\nMessage-ID: <0190a1b2-c3d4-7e5f-8"
    b"a9b-0c1d2e3f4a5b@example.com>\r\nX-Mailbag-Message-ID: 0190a1b2-c3d4-7e5f-8a9b-0c1d2"
    b"e3f4a5b\r\nX-Campaign: spring\r\nList-Id: <news.example.com>\r\nMIME-Version: 1.0\r"
    b'\nContent-Type: multipart/alternative;\r\n boundary="=_mailbag_0190a1b2c3d47e5f8a9b0'
    b'c1d2e3f4a5b"\r\n\r\n--=_mailbag_0190a1b2c3d47e5f8a9b0c1d2e3f4a5b\r\nContent-Type: t'
    b'ext/plain; charset="utf-8"\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\nH'
    b"allo Zo=C3=AB,\r\n\r\ndein Konto ist bereit.\r\n\r\n--=_mailbag_0190a1b2c3d47e5f8a9"
    b'b0c1d2e3f4a5b\r\nContent-Type: text/html; charset="utf-8"\r\nContent-Transfer-Enco'
    b"ding: quoted-printable\r\n\r\n<p>Hallo Zo=C3=AB,</p>\r\n<p>dein Konto ist bereit. E"
    b"ine sehr lange Zeile, die umgebrochen werden mus=\r\ns, weil quoted-printable h=C3=B6"
    b"chstens 76 Zeichen erlaubt.</p>\r\n\r\n--=_mailbag_0190a1b2c3d47e5f8a9b0c1d2e3f4a5b-"
    b"-\r\n"
)


def test_a_plain_templated_message_is_byte_for_byte_what_it_was() -> None:
    sent = outgoing_email(
        7,
        message_id=uuid.UUID("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
        subject="Willkommen, Zoë – dein Konto ist bereit",
        to_name="Zoë Ångström",
        headers={"X-Campaign": "spring", "List-Id": "<news.example.com>"},
        html=(
            "<p>Hallo Zoë,</p>\n<p>dein Konto ist bereit. Eine sehr lange Zeile, die umgebrochen "
            "werden muss, weil quoted-printable höchstens 76 Zeichen erlaubt.</p>\n"
        ),
        text="Hallo Zoë,\n\ndein Konto ist bereit.\n",
    )
    assert sent.raw == PLAIN_BEFORE


def test_an_email_with_everything_parses_back_to_what_was_given() -> None:
    sent = full_email(1)
    check_full_delivery(sent.raw, sent)
    check(sent.raw, sent)
    message = parsed(sent.raw)
    # mixed( related( alternative(text, html), png ), pdf )
    structure = [p.get_content_type() for p in message.walk()]
    assert structure == [
        "multipart/mixed",
        "multipart/related",
        "multipart/alternative",
        "text/plain",
        "text/html",
        "image/png",
        "application/pdf",
    ]
    (related,) = [p for p in message.walk() if p.get_content_type() == "multipart/related"]
    assert related.get_param("type") == "multipart/alternative"
    assert message.get_body(("html",))["Content-ID"] is None
    png = next(p for p in message.walk() if p.get_content_type() == "image/png")
    assert png["Content-ID"] == f"<{LOGO_CID}>"
    # base64 in lines of 76 characters (RFC 2045), all but the last full.
    pdf_lines = re.search(rb"filename\*=[^\r]+\r\n\r\n(.+?)\r\n--", sent.raw, re.S)
    assert pdf_lines is not None
    lines = pdf_lines.group(1).split(b"\r\n")
    assert {len(line) for line in lines[:-1]} == {76} and 0 < len(lines[-1]) <= 76


def test_the_checks_catch_a_bcc_header_and_a_changed_attachment() -> None:
    sent = full_email(1)
    with pytest.raises(AssertionError):
        check_full_delivery(
            sent.raw.replace(b"Subject:", b"Bcc: <dave.hidden@example.com>\r\nSubject:"), sent
        )
    pdf = tiny_pdf()
    changed = full_email(
        1,
        message_id=sent.message_id,
        attachments=(Attachment("Rechnung März.pdf", "application/pdf", pdf[:-1] + b"\n"),),
    )
    with pytest.raises((AssertionError, ValueError)):
        check_full_delivery(changed.raw, sent)


def test_inline_images_alone_make_a_related_message_and_text_alone_one_part() -> None:
    png = full_email(2).attachments[1]
    inline_only = full_email(2, attachments=(png,))
    assert parsed(inline_only.raw).get_content_type() == "multipart/related"
    check(inline_only.raw, inline_only)
    text_only = outgoing_email(3, html="", text="Just text.\n")
    message = parsed(text_only.raw)
    assert message.get_content_type() == "text/plain"
    assert message.get_content() == "Just text.\r\n"
    pdf_only = outgoing_email(
        4, html="", attachments=(Attachment("a.pdf", "application/pdf", tiny_pdf()),)
    )
    assert [p.get_content_type() for p in parsed(pdf_only.raw).walk()] == [
        "multipart/mixed",
        "text/plain",
        "application/pdf",
    ]


@pytest.mark.parametrize(
    "name",
    [
        "Rechnung März 2026.pdf",
        'the "final" version.pdf',
        "it's; a=b, c.pdf",
        "=?utf-8?q?not=20encoded?=.pdf",
        "  two  spaces .pdf",
        "東京" * 100 + ".pdf",
        "x" * 251 + ".pdf",
        "%41 percent.pdf",
    ],
)
def test_attachment_filenames_read_back_exactly(name: str) -> None:
    sent = outgoing_email(1, attachments=(Attachment(name, "application/pdf", tiny_pdf()),))
    check(sent.raw, sent)
    (part,) = parsed(sent.raw).iter_attachments()
    assert filename(part) == name
    head = sent.raw.split(b"\r\n\r\n--", 1)[0]
    assert all(len(line) <= 78 for line in sent.raw.split(b"\r\n") if b"filename" in line)
    assert head.isascii()


def test_a_non_ascii_and_a_quoted_filename_are_written_as_rfc_2231_and_a_quoted_string() -> None:
    sent = outgoing_email(
        1,
        attachments=(
            Attachment("März.pdf", "application/pdf", b"1"),
            Attachment('a "b".pdf', "application/pdf", b"2"),
        ),
    )
    assert b"filename*=utf-8''M%C3%A4rz.pdf" in sent.raw
    assert b'filename="a \\"b\\".pdf"' in sent.raw


def test_list_unsubscribe_headers_are_exactly_rfc_8058s() -> None:
    sent = outgoing_email(
        1,
        unsubscribe_url="https://example.com/unsubscribe/opaque?u=1&l=2",
        unsubscribe_mailto="unsubscribe@example.com",
    )
    assert raw_header(sent.raw, "List-Unsubscribe") == (
        "<https://example.com/unsubscribe/opaque?u=1&l=2>, <mailto:unsubscribe@example.com>"
    )
    assert b"\r\nList-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n" in sent.raw
    check(sent.raw, sent)
    # Only a mailto: no one-click POST (RFC 8058 needs an HTTPS URI for that).
    mailto = outgoing_email(2, unsubscribe_mailto="leave@example.com")
    assert raw_header(mailto.raw, "List-Unsubscribe") == "<mailto:leave@example.com>"
    assert "List-Unsubscribe-Post" not in parsed(mailto.raw)
    # A URI is ASCII: a non-ASCII local part is percent-encoded, the domain in IDNA.
    utf8 = outgoing_email(3, unsubscribe_mailto="zoë+leave@bücher.example")
    assert raw_header(utf8.raw, "List-Unsubscribe") == (
        "<mailto:zo%C3%AB+leave@xn--bcher-kva.example>"
    )
    assert "List-Unsubscribe" not in parsed(outgoing_email(4).raw)


def test_a_very_long_unsubscribe_url_is_folded_inside_its_angle_brackets() -> None:
    url = "https://example.com/u?token=" + "a" * 1970
    sent = outgoing_email(1, unsubscribe_url=url)
    assert all(len(line) <= 998 for line in sent.raw.split(b"\r\n"))
    value = raw_header(sent.raw, "List-Unsubscribe")
    # RFC 2369: whitespace inside the angle brackets is ignored.
    assert re.sub(r"\s", "", value) == f"<{url}>"


def test_several_mailboxes_are_folded_and_parse_back() -> None:
    to = tuple(Address(f"user{n}@example.com", f"Ünïcode User {n}") for n in range(12))
    cc = tuple(Address(f"cc{n}@example.com", f"Plain, Name {n}") for n in range(5))
    sent = outgoing_email(
        1,
        recipients=Recipients(to=to, cc=cc, bcc=(Address("bcc@example.com"),)),
        reply_to=(Address("a@example.com"), Address("b@example.com", "B")),
    )
    check(sent.raw, sent)
    message = parsed(sent.raw)
    assert [(a.display_name, a.addr_spec) for a in message["To"].addresses] == [
        (a.name, a.address) for a in to
    ]
    assert [(a.display_name, a.addr_spec) for a in message["Cc"].addresses] == [
        (a.name, a.address) for a in cc
    ]
    head = sent.raw.split(b"\r\n\r\n", 1)[0]
    assert all(len(line) <= 78 for line in head.split(b"\r\n"))
    assert b"bcc@example.com" not in sent.raw


def test_the_fields_own_header_wins_over_a_custom_one_of_the_same_name() -> None:
    sent = outgoing_email(
        1, reply_to=(Address("field@example.com"),), headers={"Reply-To": "<custom@example.com>"}
    )
    (reply_to,) = parsed(sent.raw).get_all("Reply-To")
    assert [a.addr_spec for a in reply_to.addresses] == ["field@example.com"]
    mailto = outgoing_email(
        2,
        unsubscribe_mailto="leave@example.com",
        headers={"List-Unsubscribe-Post": "List-Unsubscribe=One-Click"},
    )
    # No one-click POST without the HTTPS URL, even when a custom header asks for one.
    assert "List-Unsubscribe-Post" not in parsed(mailto.raw)


@pytest.mark.parametrize("role", ["cc", "bcc", "reply_to"])
def test_a_non_ascii_local_part_anywhere_needs_smtputf8(role: str) -> None:
    someone = (Address("zoë@example.com"),)
    if role == "reply_to":
        sent = outgoing_email(1, reply_to=someone)
    else:
        to = (Address("ann@example.com"),)
        sent = outgoing_email(1, recipients=Recipients(to=to, **{role: someone}))
    assert sent.needs_smtputf8
    if role == "bcc":  # in no header: the ASCII form is still writable, just not sendable
        assert "zoë".encode() not in sent.raw_utf8
    else:
        with pytest.raises(NeedsSMTPUTF8):
            _ = sent.raw
        assert "zoë@example.com".encode() in sent.raw_utf8


def test_check_renders_refuses_a_template_that_refers_to_a_missing_cid(tmp_path: Any) -> None:
    from mailbag.templates import Catalog
    from mailbag.templates.book import Book

    folder = tmp_path / "templates" / "logo"
    folder.mkdir(parents=True)
    (folder / "subject.txt").write_text("Hi")
    (folder / "body.txt").write_text("Hi {{ name }}")
    (folder / "body.html").write_text('<img src="cid:{{ cid }}"> Hi {{ name }}')
    book = Book(Catalog(tmp_path / "templates"))
    png = Attachment("logo.png", "image/png", b"png", "logo")
    good = new_message(
        to="a@example.com", template="logo", data={"name": "A", "cid": "logo"}, attachments=[png]
    )
    check_renders(good, book, good.template_data)
    bad = new_message(
        to="a@example.com", template="logo", data={"name": "A", "cid": "other"}, attachments=[png]
    )
    with pytest.raises(InvalidMessage) as refused:
        check_renders(bad, book, bad.template_data)
    assert "cid:other" in refused.value.errors["html"]


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


# What enqueue accepts as an attachment's filename: no controls (tab neither), no path.
FILENAMES = (
    st.lists(
        st.text(CHARS.filter(lambda ch: ch not in "\t/\\"), min_size=1, max_size=40)
        | TRICKY.filter(lambda t: "\\" not in t),
        min_size=1,
        max_size=8,
    )
    .map("".join)
    .map(lambda name: name[:255])
)
CONTENT_IDS = st.from_regex(
    r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,40}(@[a-z0-9.-]{1,20})?", fullmatch=True
)


@st.composite
def attachments(draw: st.DrawFn) -> Attachment:
    return Attachment(
        draw(FILENAMES),
        draw(st.sampled_from(["application/pdf", "image/png", "text/plain", "text/csv"])),
        draw(st.binary(max_size=300)),
        draw(st.none() | CONTENT_IDS),
    )


@st.composite
def emails(draw: st.DrawFn, *, rich: bool = False, name_max: int | None = None) -> OutgoingEmail:
    """An email of arbitrary text; `rich`: with Cc, Bcc, Reply-To and attachments too;
    `name_max`: display names cut to that many characters."""

    def cut(name: str | None) -> str | None:
        return name[:name_max] if name is not None and name_max is not None else name

    name = cut(draw(st.none() | TEXT))
    extra: dict[str, Any] = {}
    if rich:
        mailboxes = st.builds(
            Address,
            st.sampled_from(["a@example.com", "b@bücher.example", "c.d+e@example.org"]),
            st.none() | TEXT,
        )
        extra = {
            "recipients": Recipients(
                to=(Address("user1@example.com", name), *draw(st.lists(mailboxes, max_size=2))),
                cc=tuple(draw(st.lists(mailboxes, max_size=3))),
                bcc=(Address("hidden@example.com"),),
            ),
            "reply_to": tuple(draw(st.lists(mailboxes, max_size=2))),
            "attachments": tuple(draw(st.lists(attachments(), max_size=3))),
        }
    return outgoing_email(  # type: ignore[no-any-return]
        1,
        subject=draw(subjects()),
        to_name=name,
        from_name=cut(draw(st.none() | TEXT)),
        headers={HEADER: draw(st.text(max_size=0) | TEXT), "X-Other": draw(TEXT)},
        text=draw(st.text(CHARS | st.just("\n"), max_size=200)),
        html=draw(st.text(CHARS | st.just("\n"), min_size=1, max_size=200)),
        **extra,
    )


ROUND_TRIP = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@ROUND_TRIP
@given(emails(rich=True))
def test_ses_raw_mime_and_the_file_providers_eml_round_trip_exactly(
    tmp_path_factory: pytest.TempPathFactory, sent: OutgoingEmail
) -> None:
    check(sent.raw, sent)
    assert b"hidden@example.com" not in sent.raw
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
@given(emails(rich=True))
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
    assert list(received.rcpt_tos) == [ascii_address(a) for a in sent.envelope_recipients]
    check(received.raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"), sent)


BREVO_NAME_MAX = 70  # Brevo takes names of at most 70 characters


@pytest.fixture(scope="module")
def brevo() -> Iterator[BrevoServer]:
    with BrevoServer() as server:
        yield server


@settings(ROUND_TRIP, max_examples=12)  # each one an HTTP client and request
@given(emails(name_max=BREVO_NAME_MAX))
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
@given(emails(name_max=BREVO_NAME_MAX))
def test_brevos_json_carries_every_field_exactly_and_fits_its_schema(sent: OutgoingEmail) -> None:
    body = json.loads(json.dumps(single_payload(sent)))
    (version,) = validate_brevo_send(body)  # raises where Brevo would answer 400
    assert body["subject"] == sent.subject
    assert version["to"][0].get("name") == (sent.to_name or None)
    assert body["sender"].get("name") == (sent.from_name or None)
    assert body["htmlContent"] == sent.html and body.get("textContent", "") == sent.text
    assert {k: v for k, v in body["headers"].items() if k in sent.headers} == dict(sent.headers)
