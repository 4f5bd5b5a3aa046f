"""The operator console at /admin through the real app, on each database: log-in, CSRF,
every page, and every action with its confirmation step and audit event."""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import select

from api_helpers import api_client, new_tenant, settings_for
from mailbag.console.attachments import content_disposition
from mailbag.domain.content import Attachment
from mailbag.domain.delivery import Decision
from mailbag.domain.states import Action
from mailbag.store import senders
from mailbag.store.plan import run
from mailbag.store.schema import outbox_messages

from conftest import TestDB
from helpers import claim, enqueue, events, finalize, get

PASSWORD = "correct horse battery staple"
ACTOR = "operator:console"
NOW = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
WORKED_ON = NOW - timedelta(minutes=30)  # before NOW: a claim then never takes `pending` ones


@asynccontextmanager
async def console(db: TestDB, *, logged_in: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(db, admin_password=PASSWORD) as client:
        if logged_in:
            await login(client)
        yield client


def csrf_in(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, "the page has no CSRF field"
    return found.group(1)


async def login(client: httpx.AsyncClient, password: str = PASSWORD) -> httpx.Response:
    form = await client.get("/admin/login")
    assert form.status_code == 200
    return await client.post(
        "/admin/login", data={"csrf": csrf_in(form), "password": password, "next": "/admin"}
    )


async def token(client: httpx.AsyncClient) -> str:
    return csrf_in(await client.get("/admin"))


async def act(
    client: httpx.AsyncClient, path: str, *, confirm: bool = True, **fields: str
) -> httpx.Response:
    """An action as the browser takes it: the first POST asks, the second confirms."""
    csrf = await token(client)
    asked = await client.post(path, data={"csrf": csrf, **fields})
    if not confirm or asked.status_code != 200:
        return asked
    assert 'name="confirm" value="yes"' in asked.text
    return await client.post(path, data={"csrf": csrf, **fields, "confirm": "yes"})


def pending(db: TestDB, n: int = 1, **fields: Any) -> list[Any]:
    return enqueue(db, n, now=NOW, **fields)


def finished(db: TestDB, action: Action, n: int = 1, **fields: Any) -> list[Any]:
    """n messages claimed and finalized by a worker with `action` (MARK_UNKNOWN, BURY, ...)."""
    messages = enqueue(db, n, now=WORKED_ON, **fields)
    batch = claim(db, now=WORKED_ON, limit=n)
    assert {m.id for m in batch.messages} == {m.id for m in messages}
    outcomes = [(m.id, Decision(action, error="timeout after DATA")) for m in messages]
    finalize(db, batch.token, *outcomes, now=WORKED_ON)
    return messages


def status(db: TestDB, message_id: uuid.UUID) -> str:
    return str(get(db, message_id).status)


# --- access --------------------------------------------------------------------------------


async def test_the_console_is_off_without_a_password(db):
    async with api_client(db) as client:
        for path in ("/admin", "/admin/login", "/admin/messages"):
            assert (await client.get(path)).status_code == 404
        assert (await client.post("/admin/login", data={"password": ""})).status_code == 404


async def test_log_in_and_out(db):
    async with console(db, logged_in=False) as client:
        away = await client.get("/admin/messages?state=unknown")
        assert away.status_code == 303
        assert away.headers["location"].startswith("/admin/login?next=/admin/messages")

        wrong = await login(client, "not the password")
        assert wrong.status_code == 401
        assert "Login failed." in wrong.text and PASSWORD not in wrong.text
        assert (await client.get("/admin")).status_code == 303

        before_login = csrf_in(await client.get("/admin/login"))
        right = await login(client)
        assert right.status_code == 303 and right.headers["location"] == "/admin"
        cookie = right.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=lax" in cookie and "path=/admin" in cookie
        assert PASSWORD.lower() not in cookie
        assert (await client.get("/admin")).status_code == 200
        # A new token with the new session: one seen before the login is worth nothing.
        stale = await client.post("/admin/logout", data={"csrf": before_login})
        assert stale.status_code == 403
        schema = (await client.get("/openapi.json")).json()
        assert not [path for path in schema["paths"] if path.startswith("/admin")]

        out = await client.post("/admin/logout", data={"csrf": await token(client)})
        assert out.status_code == 303 and out.headers["location"] == "/admin/login"
        assert (await client.get("/admin")).status_code == 303


async def test_login_needs_its_form_token_and_stays_on_the_console(db):
    async with console(db, logged_in=False) as client:
        forged = await client.post("/admin/login", data={"password": PASSWORD})
        assert forged.status_code == 403
        assert (await client.get("/admin")).status_code == 303
        form = await client.get("/admin/login?next=//evil.example/x")
        assert 'value="/admin"' in form.text
        sent = await client.post(
            "/admin/login",
            data={"csrf": csrf_in(form), "password": PASSWORD, "next": "https://evil.example"},
        )
        assert sent.status_code == 303 and sent.headers["location"] == "/admin"


async def test_a_session_from_another_password_is_not_accepted(db):
    async with console(db) as client:
        cookies = dict(client.cookies)
    async with api_client(db, admin_password="another password") as other:
        for name, value in cookies.items():
            other.cookies.set(name, value, domain="mailbag.test", path="/admin")
        assert (await other.get("/admin")).status_code == 303


# --- pages ---------------------------------------------------------------------------------


async def test_every_page_renders(db):
    (unknown,) = finished(db, Action.MARK_UNKNOWN)
    (dead,) = finished(db, Action.BURY)
    (waiting,) = pending(
        db,
        template="invitation",
        data={"inviter": "Ada", "team": "Ops", "accept_url": "https://app.example/join"},
    )
    async with console(db) as client:
        await act(client, "/admin/suppressions/add", tenant="default", email="gone@example.com")

        overview = await client.get("/admin")
        assert overview.status_code == 200
        assert "Queue age" in overview.text and "<svg" in overview.text
        assert f'href="/admin/messages/{unknown.id}"' in overview.text  # needs a decision

        listing = await client.get("/admin/messages")
        assert listing.status_code == 200
        for m in (unknown, dead, waiting):
            assert f'href="/admin/messages/{m.id}"' in listing.text

        only_unknown = await client.get("/admin/messages", params={"state": "unknown"})
        assert str(unknown.id) in only_unknown.text and str(dead.id) not in only_unknown.text
        assert "Requeue all matching" in only_unknown.text

        day = NOW.date().isoformat()
        same_day = await client.get(
            "/admin/messages",
            params={
                "tenant": "default",
                "to": "USER0@example.com",
                "template": "welcome",
                "created_from": day,
                "created_to": day,
            },
        )
        assert same_day.status_code == 200 and str(unknown.id) in same_day.text
        later = (NOW + timedelta(days=2)).date().isoformat()
        assert (
            str(unknown.id)
            not in (await client.get("/admin/messages", params={"created_from": later})).text
        )

        for m in (unknown, dead, waiting):
            detail = await client.get(f"/admin/messages/{m.id}")
            assert detail.status_code == 200
            assert "<iframe" in detail.text and "sandbox" in detail.text
            assert f"&lt;{m.id}@localhost&gt;" in detail.text  # the Message-ID header
        suppressions = await client.get("/admin/suppressions")
        assert suppressions.status_code == 200 and "gone@example.com" in suppressions.text

        assert (await client.get(f"/admin/messages/{uuid.uuid4()}")).status_code == 404
        assert (await client.get("/admin/messages/not-an-id")).status_code == 404
        assert (await client.get("/admin/messages?state=bogus")).status_code == 400
        assert (await client.get("/admin/messages?created_from=yesterday")).status_code == 400


async def test_expired_messages_have_their_own_filter_and_count(db):
    (lapsed,) = finished(db, Action.LAPSE, to="late@example.com")
    (dead,) = finished(db, Action.BURY)
    async with console(db) as client:
        listing = await client.get("/admin/messages", params={"state": "expired"})
        assert listing.status_code == 200
        assert '<option value="expired" selected>' in listing.text
        assert f'href="/admin/messages/{lapsed.id}"' in listing.text
        assert str(dead.id) not in listing.text
        assert "Requeue all matching" not in listing.text  # an expired message stays expired

        overview = (await client.get("/admin")).text
        header = re.search(r"<thead><tr>(.*?)</tr></thead>\s*<tbody><tr>(.*?)</tr>", overview, re.S)
        assert header, "the overview counts messages by state"
        states = re.findall(r"<th[^>]*>(\w+)</th>", header.group(1))
        counts = re.findall(r">(\d+)</a></td>", header.group(2))
        assert dict(zip(states, counts, strict=True))["expired"] == "1"

        detail = (await client.get(f"/admin/messages/{lapsed.id}")).text
        assert 'id="state">expired<' in detail
        assert not re.findall(rf"/admin/messages/{lapsed.id}/(\w+)\"", detail)  # no action


async def test_the_list_pages_with_a_cursor(db):
    made = pending(db, 60)
    async with console(db) as client:
        first = await client.get("/admin/messages")
        older = re.search(r'href="/admin/messages\?(before=[^"]+)" rel="next"', first.text)
        assert older, "a first page of 60 links to older messages"
        second = await client.get(f"/admin/messages?{older.group(1).replace('&amp;', '&')}")
        linked = set(
            re.findall(r'href="/admin/messages/([0-9a-f-]{36})"', first.text + second.text)
        )
        assert linked == {str(m.id) for m in made}


async def test_only_the_actions_a_state_allows_are_offered(db):
    (unknown,) = finished(db, Action.MARK_UNKNOWN)
    (dead,) = finished(db, Action.BURY)
    (waiting,) = pending(db)
    (sent,) = finished(db, Action.MARK_SENT)
    offered = {
        unknown.id: {"requeue", "resolve"},
        dead.id: {"requeue"},
        waiting.id: {"cancel"},
        sent.id: set(),
    }
    async with console(db) as client:
        for message_id, expected in offered.items():
            page = (await client.get(f"/admin/messages/{message_id}")).text
            shown = set(re.findall(rf"/admin/messages/{message_id}/(\w+)\"", page))
            assert shown == expected, (status(db, message_id), shown)


async def test_values_are_escaped(db):
    (m,) = pending(db, data={"name": "<script>alert(1)</script>"}, to_name="Eve <b>")
    async with console(db) as client:
        page = (await client.get(f"/admin/messages/{m.id}")).text
        assert "<script>alert(1)" not in page
        assert "&lt;script&gt;alert(1)" in page


async def test_a_template_that_cannot_render_shows_the_error(db):
    (m,) = pending(db, template="invitation", data={})  # its variables are missing
    async with console(db) as client:
        page = await client.get(f"/admin/messages/{m.id}")
        assert page.status_code == 200
        assert "cannot be rendered" in page.text and "UndefinedError" in page.text


async def test_a_verification_preview_never_shows_its_token(db):
    _, key = new_tenant(db)
    async with console(db) as client:
        created = await client.post(
            "/v1/email-verifications",
            json={"email": "reader@example.com", "redirect_url": "https://app.example/verify"},
            headers={"Authorization": f"Bearer {key}", "Idempotency-Key": "signup-1"},
        )
        assert created.status_code == 201, created.text
        with db.engine.connect() as conn:
            message_id = conn.execute(
                select(outbox_messages.c.id).where(
                    outbox_messages.c.template_name == "verify-email"
                )
            ).scalar_one()
        # The token is not stored: derive the one the worker will render.
        secret = settings_for(db).verification_tokens.token(uuid.UUID(created.json()["id"]), 1)

        page = await client.get(f"/admin/messages/{message_id}")
        assert page.status_code == 200
        assert secret not in page.text and "[redacted]" in page.text
        assert "https://app.example/verify?verification_id=" in page.text  # the link's shape
        assert "reader@example.com" in page.text  # the rest of the email is there


# --- what a message carries -----------------------------------------------------------------

PDF = b"%PDF-1.4\n" + bytes(range(256)) * 40 + b"\n%%EOF\n"  # binary: bytes must survive as-is
PAGE = b"<!doctype html><script>alert(document.cookie)</script>"
LOGO = b"\x89PNG not really"


def carrying(db: TestDB) -> Any:
    """A ready-made message with every kind of recipient, a sender identity, expiry,
    priority, an unsubscribe link and three attachments; one Cc is suppressed."""
    with db.engine.begin() as conn:
        run(conn, senders.add("default", "billing@acme.example", None, NOW))
    (m,) = pending(
        db,
        to=[{"address": "ada@example.com", "name": "Ada Lovelace"}, "bob@example.com"],
        cc=["carol@example.com", "gone@example.com"],
        bcc=[{"address": "audit@acme.example", "name": "Audit"}],
        reply_to={"address": "help@acme.example", "name": "Acme Help"},
        from_address="billing@acme.example",
        from_name="Acme Billing",
        template=None,
        data=None,
        subject="Your invoice",
        html='<p>Invoice attached.</p><img src="cid:logo">',
        attachments=[
            Attachment("Invoice 7.pdf", "application/pdf", PDF),
            Attachment("logo.png", "image/png", LOGO, "logo"),
            Attachment("page.html", "text/html", PAGE),
        ],
        priority="high",
        expires_at=NOW + timedelta(days=2),
        unsubscribe_url="https://acme.example/unsubscribe?u=7",
    )
    return m


async def test_the_detail_page_shows_recipients_sender_and_attachments(db):
    async with console(db) as client:
        await act(client, "/admin/suppressions/add", tenant="default", email="gone@example.com")
        m = carrying(db)
        page = (await client.get(f"/admin/messages/{m.id}")).text
        listing = (await client.get("/admin/messages")).text
    # The list names the first To and counts the others (Bob, Carol, Audit; not the suppressed).
    assert re.search(r'ada@example.com</a> <span class="muted">\+3</span>', listing)
    assert "<td>ready-made</td>" in listing
    recipients = re.search(r'<table id="recipients">.*?</table>', page, re.S)
    assert recipients
    rows = [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", recipients.group(0), re.S)
    ]
    assert [r for r in rows if r] == [
        ["To", "ada@example.com", "Ada Lovelace"],
        ["To", "bob@example.com", ""],
        ["Cc", "carol@example.com", ""],
        ["Bcc", "audit@acme.example", "Audit"],
        ["Reply-To", "help@acme.example", "Acme Help"],
    ]
    assert re.search(r'id="suppressed">[^<]*<span class="mono">gone@example.com</span>', page)
    assert "billing@acme.example (Acme Billing)" in page
    assert ">ready-made<" in page and 'id="priority">high<' in page
    assert (NOW + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ") in page
    assert "https://acme.example/unsubscribe?u=7" in page
    attachments = re.search(r'<table id="attachments">.*?</table>', page, re.S)
    assert attachments
    for position, (name, kind, size) in enumerate(
        [
            ("Invoice 7.pdf", "application/pdf", "10.0 KiB"),
            ("logo.png", "image/png", f"{len(LOGO)} bytes"),
            ("page.html", "text/html", f"{len(PAGE)} bytes"),
        ]
    ):
        assert f"<td>{name}</td>" in attachments.group(0)
        assert f">{kind}<" in attachments.group(0) and f">{size}<" in attachments.group(0)
        assert f'href="/admin/messages/{m.id}/attachments/{position}"' in attachments.group(0)
    assert ">cid:logo<" in attachments.group(0)


async def test_an_operator_downloads_an_attachment_as_bytes_never_as_a_page(db):
    m = carrying(db)
    base = f"/admin/messages/{m.id}/attachments"
    async with console(db, logged_in=False) as client:
        away = await client.get(f"{base}/0")
        assert away.status_code == 303 and away.headers["location"].startswith("/admin/login")
        assert PDF not in away.content

        await login(client)
        pdf = await client.get(f"{base}/0")
        assert pdf.status_code == 200 and pdf.content == PDF
        assert pdf.headers["content-type"] == "application/pdf"
        assert pdf.headers["content-disposition"] == (
            "attachment; filename=\"Invoice 7.pdf\"; filename*=UTF-8''Invoice%207.pdf"
        )
        assert pdf.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in pdf.headers["content-security-policy"]
        assert pdf.headers["cache-control"] == "no-store"

        # Uploaded HTML would run in the console's origin if it were served as HTML.
        page = await client.get(f"{base}/2")
        assert page.status_code == 200 and page.content == PAGE
        assert page.headers["content-type"] == "application/octet-stream"
        assert page.headers["content-disposition"].startswith('attachment; filename="page.html"')

        for missing in (
            f"{base}/3",
            f"{base}/-1",
            f"{base}/x",
            f"{base}/99999",
            f"/admin/messages/{uuid.uuid4()}/attachments/0",
            "/admin/messages/not-an-id/attachments/0",
        ):
            refused = await client.get(missing)
            assert refused.status_code == 404, missing
            assert PDF not in refused.content


async def test_a_plain_text_message_has_no_empty_preview(db):
    (m,) = pending(db, template=None, data=None, subject="Note", text="Just words.\n")
    async with console(db) as client:
        page = (await client.get(f"/admin/messages/{m.id}")).text
    assert "<iframe" not in page and 'id="no-html"' in page
    assert "<pre>Just words.\n</pre>" in page


async def test_the_preview_carries_inline_images_as_data_and_leaves_remote_ones(db):
    m = carrying(db)
    async with console(db) as client:
        page = (await client.get(f"/admin/messages/{m.id}")).text
    srcdoc = re.search(r'srcdoc="([^"]*)"', page)
    assert srcdoc
    logo = f"data:image/png;base64,{base64.b64encode(LOGO).decode()}"
    assert f"&lt;img src=&#34;{logo}&#34;&gt;" in srcdoc.group(1)
    assert "cid:" not in srcdoc.group(1)
    # Neither the PDF nor the HTML attachment is part of the preview.
    assert base64.b64encode(PDF[:60]).decode() not in page
    assert base64.b64encode(PAGE).decode() not in page


def test_a_download_is_named_safely_whatever_the_stored_name():
    named = {
        "Invoice 7.pdf": "attachment; filename=\"Invoice 7.pdf\"; filename*=UTF-8''Invoice%207.pdf",
        "Rechnung März.pdf": (
            "attachment; filename=\"Rechnung M_rz.pdf\"; filename*=UTF-8''Rechnung%20M%C3%A4rz.pdf"
        ),
        'say "hi"; x=1.txt': (
            'attachment; filename="say _hi_; x=1.txt"; '
            "filename*=UTF-8''say%20%22hi%22%3B%20x%3D1.txt"
        ),
        "../../etc/passwd": "attachment; filename=\"passwd\"; filename*=UTF-8''passwd",
        "..\\boot.ini\r\n": "attachment; filename=\"boot.ini\"; filename*=UTF-8''boot.ini",
        "...": "attachment; filename=\"attachment\"; filename*=UTF-8''attachment",
    }
    for stored, header in named.items():
        assert content_disposition(stored) == header, stored


# --- CSRF ----------------------------------------------------------------------------------


async def test_a_post_without_the_right_csrf_token_changes_nothing(db):
    (unknown,) = finished(db, Action.MARK_UNKNOWN)
    path = f"/admin/messages/{unknown.id}/requeue"
    before = len(events(db, unknown.id))
    async with console(db) as client:
        real = await token(client)
        for fields in ({}, {"csrf": ""}, {"csrf": "forged"}, {"csrf": real[:-1] + "x"}):
            refused = await client.post(path, data={**fields, "confirm": "yes"})
            assert refused.status_code == 403, fields
        add = await client.post(
            "/admin/suppressions/add",
            data={"tenant": "default", "email": "x@example.com", "confirm": "yes"},
        )
        assert add.status_code == 403
        assert "x@example.com" not in (await client.get("/admin/suppressions")).text
        out = await client.post("/admin/logout")
        assert out.status_code == 403 and (await client.get("/admin")).status_code == 200
    assert status(db, unknown.id) == "unknown"
    assert len(events(db, unknown.id)) == before


async def test_a_post_without_a_session_goes_to_the_login(db):
    (unknown,) = finished(db, Action.MARK_UNKNOWN)
    async with console(db, logged_in=False) as client:
        refused = await client.post(
            f"/admin/messages/{unknown.id}/requeue", data={"confirm": "yes"}
        )
        assert refused.status_code == 303 and refused.headers["location"].startswith("/admin/login")
    assert status(db, unknown.id) == "unknown"


# --- actions -------------------------------------------------------------------------------


async def test_requeue_an_unknown_message(db):
    (unknown,) = finished(db, Action.MARK_UNKNOWN)
    path = f"/admin/messages/{unknown.id}/requeue"
    async with console(db) as client:
        asked = await act(client, path, confirm=False)
        assert asked.status_code == 200 and "Requeue this message?" in asked.text
        assert status(db, unknown.id) == "unknown"  # asking changed nothing

        done = await act(client, path)
        assert (
            done.status_code == 303 and done.headers["location"] == f"/admin/messages/{unknown.id}"
        )
        page = await client.get(done.headers["location"])
        assert "Requeued: the message is pending again." in page.text
        again = await client.get(done.headers["location"])
        assert "Requeued:" not in again.text  # the flash is shown once
    assert status(db, unknown.id) == "pending"
    last = events(db, unknown.id)[-1]
    assert (last.from_status, last.to_status, last.actor) == ("unknown", "pending", ACTOR)


async def test_requeue_a_dead_message_and_refuse_a_pending_one(db):
    (dead,) = finished(db, Action.BURY)
    (waiting,) = pending(db)
    async with console(db) as client:
        assert (await act(client, f"/admin/messages/{dead.id}/requeue")).status_code == 303
        refused = await act(client, f"/admin/messages/{waiting.id}/requeue")
        assert refused.status_code == 409 and "Nothing was changed" in refused.text
    assert status(db, dead.id) == "pending"
    assert events(db, dead.id)[-1].actor == ACTOR
    assert len(events(db, waiting.id)) == 1


async def test_cancel_a_pending_message(db):
    (waiting,) = pending(db)
    (unknown,) = finished(db, Action.MARK_UNKNOWN)
    async with console(db) as client:
        done = await act(client, f"/admin/messages/{waiting.id}/cancel")
        assert done.status_code == 303
        assert "Cancelled" in (await client.get(done.headers["location"])).text
        assert (await act(client, f"/admin/messages/{unknown.id}/cancel")).status_code == 409
    assert status(db, waiting.id) == "cancelled"
    assert events(db, waiting.id)[-1].actor == ACTOR
    assert status(db, unknown.id) == "unknown"


async def test_resolve_needs_evidence(db):
    (unknown,) = finished(db, Action.MARK_UNKNOWN)
    path = f"/admin/messages/{unknown.id}/resolve"
    async with console(db) as client:
        for evidence in ("", "   "):
            refused = await act(client, path, outcome="sent", evidence=evidence)
            assert refused.status_code == 400 and "Evidence required" in refused.text
            csrf = await token(client)
            forced = await client.post(
                path, data={"csrf": csrf, "outcome": "sent", "evidence": evidence, "confirm": "yes"}
            )
            assert forced.status_code == 400
        assert (await act(client, path, outcome="maybe", evidence="x")).status_code == 400
    assert status(db, unknown.id) == "unknown"


async def test_resolve_as_sent_and_as_failed(db):
    sent, failed = finished(db, Action.MARK_UNKNOWN, 2)
    async with console(db) as client:
        asked = await act(
            client,
            f"/admin/messages/{sent.id}/resolve",
            confirm=False,
            outcome="sent",
            evidence="SES console shows it delivered",
        )
        assert "Mark this message as sent?" in asked.text
        assert "SES console shows it delivered" in asked.text
        done = await act(
            client,
            f"/admin/messages/{sent.id}/resolve",
            outcome="sent",
            evidence="SES console shows it delivered",
            provider_message_id="0100-abc",
        )
        assert done.status_code == 303
        done = await act(
            client,
            f"/admin/messages/{failed.id}/resolve",
            outcome="failed",
            evidence="relay log: connection reset before DATA",
        )
        assert done.status_code == 303
        again = await act(
            client,
            f"/admin/messages/{failed.id}/resolve",
            outcome="sent",
            evidence="changed my mind",
        )
        assert again.status_code == 409
    resolved_sent, resolved_failed = get(db, sent.id), get(db, failed.id)
    assert resolved_sent.status == "sent" and resolved_sent.provider_message_id == "0100-abc"
    assert resolved_failed.status == "failed"
    for message_id, evidence in (
        (sent.id, "SES console shows it delivered"),
        (failed.id, "relay log: connection reset before DATA"),
    ):
        last = events(db, message_id)[-1]
        assert (last.from_status, last.actor, last.detail) == ("unknown", ACTOR, evidence)


async def test_bulk_requeue_by_filter(db):
    unknown = finished(db, Action.MARK_UNKNOWN, 3)
    (other_template,) = finished(
        db,
        Action.MARK_UNKNOWN,
        template="invitation",
        data={"inviter": "A", "team": "B", "accept_url": "https://x.example"},
        to="other@example.com",
    )
    (dead,) = finished(db, Action.BURY, to="dead@example.com")
    fields = {"state": "unknown", "template": "welcome"}
    async with console(db) as client:
        asked = await act(client, "/admin/messages/bulk-requeue", confirm=False, **fields)
        assert asked.status_code == 200 and "3 messages match." in asked.text
        assert all(status(db, m.id) == "unknown" for m in unknown)

        done = await act(client, "/admin/messages/bulk-requeue", **fields)
        assert done.status_code == 303
        assert "Requeued 3 messages." in (await client.get(done.headers["location"])).text

        nothing = await act(client, "/admin/messages/bulk-requeue", confirm=False, **fields)
        assert "No messages match" in nothing.text and 'value="yes"' not in nothing.text
        wrong_state = await act(client, "/admin/messages/bulk-requeue", state="sent")
        assert wrong_state.status_code == 400
    assert all(status(db, m.id) == "pending" for m in unknown)
    assert all(events(db, m.id)[-1].actor == ACTOR for m in unknown)
    assert status(db, other_template.id) == "unknown" and status(db, dead.id) == "dead"


async def test_add_and_remove_a_suppression(db):
    async with console(db) as client:
        asked = await act(
            client,
            "/admin/suppressions/add",
            confirm=False,
            tenant="default",
            email="Bounced@Example.COM",
            detail="asked us to stop",
        )
        assert asked.status_code == 200 and "Suppress this address?" in asked.text
        assert "Bounced@example.com" not in (await client.get("/admin/suppressions")).text

        added = await act(
            client,
            "/admin/suppressions/add",
            tenant="default",
            email="Bounced@Example.COM",
            detail="asked us to stop",
        )
        assert added.status_code == 303 and added.headers["location"] == "/admin/suppressions"
        listed = (await client.get("/admin/suppressions")).text
        assert "bounced@example.com" in listed and "manual" in listed
        assert "asked us to stop" in listed

        invalid = await act(client, "/admin/suppressions/add", tenant="default", email="nope")
        assert invalid.status_code == 400

        removed = await act(
            client, "/admin/suppressions/remove", tenant="default", email="bounced@example.com"
        )
        assert removed.status_code == 303
        page = (await client.get("/admin/suppressions")).text
        assert "Removed the suppression" in page and "asked us to stop" not in page

    # Suppressed again, a new message to it fails at once (the console's entry counts).
    async with console(db) as client:
        await act(client, "/admin/suppressions/add", tenant="default", email="gone@example.com")
    (blocked,) = pending(db, to="gone@example.com")
    assert status(db, blocked.id) == "failed"
