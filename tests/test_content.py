"""What one message can carry, checked before anything is written (domain.content and
new_message): recipients, ready-made bodies, attachments, limits, expiry, priority."""

from __future__ import annotations

import http.server
import threading
from datetime import UTC, datetime, timedelta

import pytest

from mailbag.domain.content import (
    HEAD_START,
    Address,
    Attachment,
    Limits,
    Priority,
    Recipients,
    cid_references,
    head_start,
)
from mailbag.domain.message import InvalidMessage, MessageTooLarge, new_message

PDF = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n"


def ready(**fields: object) -> dict[str, object]:
    return {"to": "ada@example.com", "subject": "Hello", "html": "<p>Hi</p>", **fields}


def refused(**fields: object) -> dict[str, str]:
    with pytest.raises(InvalidMessage) as excinfo:
        new_message(**fields)  # type: ignore[arg-type]
    return excinfo.value.errors


def test_recipients_of_every_kind_are_normalized_with_their_names() -> None:
    m = new_message(
        to=["ada@EXAMPLE.com", {"address": "bob@example.com", "name": "Bob B."}],
        cc=[Address("cy@example.com", "Cy")],
        bcc="dee@example.com",
        reply_to=["help@example.com", "desk@example.com"],
        template="welcome",
    )
    assert m.recipients.to == (
        Address("ada@example.com"),
        Address("bob@example.com", "Bob B."),
    )
    assert m.recipients.cc == (Address("cy@example.com", "Cy"),)
    assert m.recipients.bcc == (Address("dee@example.com"),)
    assert [a.address for a in m.reply_to] == ["help@example.com", "desk@example.com"]
    assert m.to_address == "ada@example.com"
    assert m.recipients.envelope == [
        "ada@example.com",
        "bob@example.com",
        "cy@example.com",
        "dee@example.com",
    ]
    assert not m.recipients.is_single


def test_a_single_to_with_to_name_keeps_working() -> None:
    m = new_message(to="ada@example.com", to_name="Ada", template="welcome")
    assert m.recipients == Recipients(to=(Address("ada@example.com", "Ada"),))
    assert m.recipients.is_single


def test_recipients_json_round_trips_and_suppressed_ones_drop() -> None:
    r = Recipients(
        to=(Address("a@example.com", "A"), Address("b@example.com")),
        cc=(Address("c@example.com"),),
    )
    assert Recipients.from_json(r.as_json()) == r
    assert r.without({"b@example.com", "c@example.com"}) == Recipients(
        to=(Address("a@example.com", "A"),)
    )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"to": []}, "to"),
        ({"to": ["a@example.com", "not an address"]}, "to"),
        ({"cc": ["x@y\r\nBcc: evil@example.com"]}, "cc"),
        ({"bcc": [{"address": "b@example.com", "name": "B\nX-Evil: 1"}]}, "bcc"),
        ({"reply_to": [{"address": "b@example.com", "name": 7}]}, "reply_to"),
        ({"from_name": "x\ny"}, "from_name"),
        ({"priority": "urgent"}, "priority"),
        ({"unsubscribe_url": "http://example.com/u"}, "unsubscribe_url"),
        ({"unsubscribe_url": "https://example.com/u>, <https://evil"}, "unsubscribe_url"),
        ({"unsubscribe_mailto": "not-an-address"}, "unsubscribe_mailto"),
        ({"expires_at": datetime(2030, 1, 1)}, "expires_at"),
        ({"headers": {"Reply-To": "<a@example.com>"}, "reply_to": "b@example.com"}, "headers"),
    ],
)
def test_bad_fields_are_refused_naming_the_field(fields: dict[str, object], field: str) -> None:
    assert field in refused(**{"to": "ada@example.com", "template": "welcome", **fields})


def test_the_recipient_limit_counts_to_cc_and_bcc_together() -> None:
    to = [f"u{i}@example.com" for i in range(30)]
    cc = [f"c{i}@example.com" for i in range(20)]
    assert new_message(to=to, cc=cc, template="welcome")
    errors = refused(to=to, cc=cc, bcc=["one@example.com"], template="welcome")
    assert "51 recipients" in errors["to"]
    assert new_message(to=to, cc=cc, bcc=["x@example.com"], template="w", limits=Limits(60))


def test_content_is_a_template_or_ready_made_never_both_never_neither() -> None:
    assert "template" in refused(to="a@example.com")
    assert "template" in refused(to="a@example.com", template="w", html="<p>x</p>")
    assert "subject" in refused(to="a@example.com", html="<p>x</p>")
    assert "data" in refused(**ready(data={"name": "Ada"}))
    assert "inline_css" in refused(to="a@example.com", template="w", inline_css=True)
    assert "html" in refused(**ready(html="   "))


def test_text_is_generated_from_html_and_css_is_inlined_on_request() -> None:
    m = new_message(
        **ready(
            html="<style>p { color: red }</style><p>Hello <b>Ada</b></p><ul><li>one</li></ul>",
            inline_css=True,
        )
    )
    assert m.html is not None and 'style="color: red;"' in m.html
    assert "<style>" not in m.html
    assert m.text is not None and "Hello Ada" in m.text and "one" in m.text
    given = new_message(**ready(text="Exactly this.\n"))
    assert given.text == "Exactly this.\n" and given.template_name is None


def test_inlining_css_never_fetches_a_linked_stylesheet() -> None:
    requests: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"p { color: blue }")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/evil.css"
        m = new_message(
            **ready(html=f'<link rel="stylesheet" href="{url}"><p>x</p>', inline_css=True)
        )
    finally:
        server.shutdown()
    assert requests == []
    assert m.html is not None and "evil.css" not in m.html


def test_attachments_are_checked_and_cid_references_must_resolve() -> None:
    logo = Attachment("logo.png", "image/png", b"\x89PNG\r\n", content_id="logo@acme")
    pdf = Attachment("invoice.pdf", "application/pdf", PDF)
    m = new_message(**ready(html='<img src="cid:logo@acme">', attachments=[pdf, logo]))
    assert [a.filename for a in m.attachments] == ["invoice.pdf", "logo.png"]
    assert pdf.sha256 == pdf.ref.sha256 and pdf.ref.size == len(PDF)
    assert cid_references("<td background='cid:bg'><img src=\"CID:x\">") == {"bg", "x"}

    assert "html" in refused(**ready(html='<img src="cid:missing">', attachments=[logo]))
    for bad in (
        Attachment("", "application/pdf", PDF),
        Attachment("../etc/passwd", "application/pdf", PDF),
        Attachment("a\r\nb.pdf", "application/pdf", PDF),
        Attachment("a.pdf", "PDF", PDF),
        Attachment("a.pdf", "application/pdf", PDF, content_id="two words"),
    ):
        assert "attachments" in refused(**ready(attachments=[bad]))
    twice = [logo, Attachment("other.png", "image/png", b"x", content_id="logo@acme")]
    assert "used twice" in refused(**ready(attachments=twice))["attachments"]


def test_size_limits_raise_message_too_large() -> None:
    limits = Limits(max_attachment_bytes=100, max_message_bytes=150)
    with pytest.raises(MessageTooLarge) as one:
        new_message(
            **ready(attachments=[Attachment("a.bin", "application/pdf", b"x" * 101)]), limits=limits
        )
    assert "limit for one attachment is 100" in one.value.errors["attachments"]
    two = [Attachment(f"{i}.bin", "application/pdf", b"x" * 80) for i in range(2)]
    with pytest.raises(MessageTooLarge) as total:
        new_message(**ready(attachments=two), limits=limits)
    assert "the limit is 150" in total.value.errors["attachments"]
    too_many = [Attachment(f"{i}.bin", "application/pdf", b"x") for i in range(3)]
    errors = refused(**ready(attachments=too_many), limits=Limits(max_attachments=2))
    assert "at most 2" in errors["attachments"]


def test_expiry_and_priority() -> None:
    soon = datetime(2030, 1, 1, tzinfo=UTC)
    m = new_message(to="a@example.com", template="w", expires_at=soon, priority="high")
    assert m.expires_at == soon and m.priority is Priority.HIGH
    assert "expires_at" in refused(
        to="a@example.com", template="w", send_at=soon, expires_at=soon - timedelta(1)
    )
    assert new_message(to="a@example.com", template="w").priority is Priority.NORMAL
    assert head_start(Priority.HIGH) == HEAD_START and head_start(Priority.LOW) == -HEAD_START
    assert Priority.named("low").label == "low"


def test_what_the_provider_cannot_carry_is_refused_at_enqueue() -> None:
    brevo_like = Limits(
        max_reply_to=1, attachment_extensions=frozenset({"pdf", "png"}), provider="brevo"
    )
    two_replies = {"reply_to": ["a@example.com", "b@example.com"]}
    assert "brevo" in refused(**ready(**two_replies), limits=brevo_like)["reply_to"]
    assert new_message(**ready(**two_replies))  # no provider restriction: fine
    exe = Attachment("setup.exe", "application/octet-stream", b"MZ")
    assert "(exe)" in refused(**ready(attachments=[exe]), limits=brevo_like)["attachments"]
    pdf = Attachment("Invoice.PDF", "application/pdf", PDF)
    assert new_message(**ready(attachments=[pdf]), limits=brevo_like).attachments == (pdf,)
    named = Limits(max_name_length=70, provider="brevo")
    long_name = {"cc": [{"address": "c@example.com", "name": "x" * 71}]}
    assert "at most 70" in refused(**ready(**long_name), limits=named)["cc"]
    assert new_message(**ready(cc=[{"address": "c@example.com", "name": "x" * 70}]), limits=named)


def test_the_limits_come_from_the_settings_and_the_configured_provider() -> None:
    from mailbag.providers.brevo import ATTACHMENT_EXTENSIONS
    from mailbag.services.intake import limits
    from mailbag.settings import Settings

    brevo = limits(Settings(provider="brevo", max_recipients=7))
    assert (brevo.max_recipients, brevo.max_reply_to, brevo.max_name_length) == (7, 1, 70)
    assert brevo.attachment_extensions == ATTACHMENT_EXTENSIONS
    smtp = limits(Settings(provider="smtp", smtp_host="localhost"))
    assert smtp.max_reply_to is None and smtp.attachment_extensions is None


def test_expired_messages_are_not_provider_errors() -> None:
    from mailbag.services.operations import Health

    def rate(endings: dict[str, int]) -> float | None:
        return Health({}, None, [], endings).provider_error_rate

    assert rate({"sent": 3, "failed": 1}) == 0.25
    assert rate({"sent": 3, "failed": 1, "expired": 40}) == 0.25
    assert rate({"expired": 5}) is None
