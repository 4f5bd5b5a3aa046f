"""The console in a real browser (Debian's Chromium driven by Playwright) over real HTTP.

JavaScript is off in the browser: every page and action must work without it. A screenshot
of each page lands in test-artifacts/console/ for a person to look at.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from api_helpers import settings_for
from mailbag.api import create_app
from mailbag.domain.content import Attachment
from mailbag.domain.delivery import Decision
from mailbag.domain.states import Action
from servers import uvicorn_thread

from conftest import TestDB
from helpers import claim, enqueue, finalize, get

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "console"
PASSWORD = "browser test password"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def png(width: int, height: int) -> bytes:
    """A real PNG of width x height blue pixels, so the browser has an image to decode."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    rows = b"".join(b"\x00" + b"\x20\x40\xc0" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def finished(db: TestDB, action: Action, at: datetime, **fields: Any) -> Any:
    (message,) = enqueue(db, 1, now=at, **fields)
    batch = claim(db, now=at, limit=1)
    assert [m.id for m in batch.messages] == [message.id]
    error = None if action is Action.MARK_SENT else "timeout after DATA"
    finalize(db, batch.token, (message.id, Decision(action, error=error)), now=at)
    return message


@pytest.fixture
def chromium() -> Iterator[Any]:
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing: install Debian's chromium to run the console in a browser"
        if IN_CI:
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    # An explicit executable: Playwright never downloads a browser of its own here.
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_an_operator_requeues_an_unknown_message_in_the_browser(db, chromium):
    now = datetime.now(UTC)
    for minutes in (50, 35, 20, 20, 5):
        finished(
            db, Action.MARK_SENT, now - timedelta(minutes=minutes), to=f"m{minutes}@example.com"
        )
    finished(db, Action.BURY, now - timedelta(minutes=15), to="dead@example.com")
    unknown = finished(
        db,
        Action.MARK_UNKNOWN,
        now - timedelta(minutes=10),
        to="ada@example.com",
        data={"name": "Ada"},
    )
    enqueue(db, 1, now=now, to="later@example.com", send_at=now + timedelta(hours=1))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    app = create_app(settings_for(db, admin_password=PASSWORD))
    with uvicorn_thread(app) as base:
        context = chromium.new_context(
            java_script_enabled=False, viewport={"width": 1280, "height": 900}
        )
        page = context.new_page()
        page.set_default_timeout(10_000)

        def shot(name: str) -> None:
            page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

        page.goto(f"{base}/admin")
        assert page.url.startswith(f"{base}/admin/login")
        shot("login")
        page.fill("#password", "wrong")
        page.click("button[type=submit]")
        assert "Login failed." in page.inner_text("body")
        page.fill("#password", PASSWORD)
        page.click("button[type=submit]")
        assert page.url == f"{base}/admin"
        assert page.inner_text("h1") == "Overview"
        assert page.locator("svg rect.bar").count() == 4  # 5 sends in 4 five-minute buckets
        shot("overview")

        page.click("nav >> text=Messages")
        page.select_option("select[name=state]", "unknown")
        page.click("form.filters button[type=submit]")
        assert "state=unknown" in page.url
        rows = page.locator("table tbody tr")
        assert rows.count() == 1 and "ada@example.com" in rows.first.inner_text()
        shot("messages")

        page.click("text=ada@example.com")
        assert page.url == f"{base}/admin/messages/{unknown.id}"
        assert page.inner_text("#state") == "unknown"
        preview = page.frame_locator("iframe.preview")
        assert "Ada" in preview.locator("body").inner_text()
        shot("detail")

        page.click("button:has-text('Requeue…')")
        assert "Requeue this message?" in page.inner_text("h1")
        shot("confirmation")
        page.click("button:has-text('Yes, requeue this message')")
        assert page.url == f"{base}/admin/messages/{unknown.id}"
        assert page.inner_text("#state") == "pending"
        assert "Requeued: the message is pending again." in page.inner_text(".flash")
        assert "operator:console" in page.inner_text("body")  # the audit event's actor

        page.click("nav >> text=Suppressions")
        page.fill("input[name=email]", "bounced@example.com")
        page.click("button:has-text('Suppress…')")
        page.click("button:has-text('Yes, suppress this address')")
        assert "Suppressed bounced@example.com" in page.inner_text(".flash")
        assert "bounced@example.com" in page.inner_text("table")
        shot("suppressions")
        context.close()

        # With scripts on, nothing on the page breaks the console's own CSP.
        context = chromium.new_context()
        page = context.new_page()
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.goto(f"{base}/admin/login?next=/admin/messages/{unknown.id}")
        page.fill("#password", PASSWORD)
        page.click("button[type=submit]")
        assert page.inner_text("#state") == "pending"
        assert "Ada" in page.frame_locator("iframe.preview").locator("body").inner_text()
        assert problems == []
        context.close()

    assert get(db, unknown.id).status == "pending"
    for name in ("login", "overview", "messages", "detail", "confirmation", "suppressions"):
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 0


def log_in(page: Any, base: str, next_path: str) -> None:
    page.goto(f"{base}/admin/login?next={next_path}")
    page.fill("#password", PASSWORD)
    page.click("button[type=submit]")
    assert page.url == f"{base}{next_path}"


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_the_preview_shows_the_email_with_its_inline_images_and_nothing_remote(db, chromium):
    now = datetime.now(UTC)
    (templated,) = enqueue(db, 1, now=now, to="ada@example.com", data={"name": "Ada"})
    (ready_made,) = enqueue(
        db,
        1,
        now=now,
        to="grace@example.com",
        template=None,
        data=None,
        subject="Your invoice",
        html=(
            "<p>Invoice <b>INV-7</b> is attached.</p>"
            '<img id="logo" alt="logo" src="cid:logo@acme">'
            '<img id="pixel" alt="" src="https://tracker.invalid/open.png">'
        ),
        attachments=[
            Attachment("logo.png", "image/png", png(3, 2), "logo@acme"),
            Attachment("invoice.pdf", "application/pdf", b"%PDF-1.4 invoice"),
        ],
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    app = create_app(settings_for(db, admin_password=PASSWORD))
    with uvicorn_thread(app) as base:
        # With scripts on too: then the console's CSP would report anything it blocks.
        for scripts in (False, True):
            context = chromium.new_context(
                java_script_enabled=scripts, viewport={"width": 1280, "height": 900}
            )
            remote, problems = check_previews(context.new_page(), base, templated, ready_made)
            # The tracking pixel is stopped in the browser by the policy: nothing went out.
            assert all(why and "csp" in why.lower() for why in remote.values()), remote
            # The only report is that blocked pixel: nothing of the console's own.
            assert all("tracker.invalid" in text for text in problems), problems
            context.close()


def check_previews(
    page: Any, base: str, templated: Any, ready_made: Any
) -> tuple[dict[str, str | None], list[str]]:
    """Both previews as the operator sees them. Returns the requests for anything not on
    the console (with how each failed: a blocked one may still be reported as a request)
    and the errors the page reported."""
    page.set_default_timeout(10_000)
    remote: dict[str, str | None] = {}

    def failed(request: Any) -> None:
        remote[request.url] = request.failure

    page.on("request", lambda r: remote.setdefault(r.url, None) if base not in r.url else None)
    page.on("requestfailed", lambda r: failed(r) if base not in r.url else None)
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)

    log_in(page, base, f"/admin/messages/{templated.id}")
    assert page.inner_text("#state") == "pending"  # the message page, not an error page
    body = page.frame_locator("iframe.preview").locator("body").inner_text()
    assert "Hello Ada," in body and "Welcome to mailbag" in body

    page.goto(f"{base}/admin/messages/{ready_made.id}")
    assert page.inner_text("#state") == "pending"
    frame = page.frame_locator("iframe.preview")
    assert "Invoice INV-7 is attached." in frame.locator("body").inner_text()
    logo = frame.locator("img#logo")
    assert logo.evaluate("img => img.complete && img.naturalWidth") == 3
    assert logo.evaluate("img => img.naturalHeight") == 2
    assert frame.locator("img#pixel").evaluate("img => img.naturalWidth") == 0
    page.screenshot(path=str(ARTIFACTS / "preview.png"), full_page=True)
    return remote, problems


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_an_operator_pauses_and_resumes_a_tenant_in_the_browser(db, chromium):
    from mailbag.services.tenants import create_tenant

    acme, _ = create_tenant(db.engine, "acme")
    (waiting,) = enqueue(db, 1, tenant_id=acme.id, to="held@example.com")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    app = create_app(settings_for(db, admin_password=PASSWORD))
    with uvicorn_thread(app) as base:
        context = chromium.new_context(java_script_enabled=False)
        page = context.new_page()
        page.set_default_timeout(10_000)
        log_in(page, base, "/admin")
        page.click("nav >> text=Pauses")
        assert "Nothing is paused" in page.inner_text("main")
        page.select_option("select[name=scope]", "tenant")
        page.fill("input[name=target]", "acme")
        page.fill("input[name=reason]", "complaints")
        page.click("button:has-text('Pause…')")
        assert page.inner_text("h1") == f"Pause tenant acme ({acme.id})?"
        page.click("button:has-text('Yes, pause')")
        assert page.url == f"{base}/admin/pauses"
        assert "Paused tenant acme" in page.inner_text(".flash")
        row = page.locator("#pauses tbody tr")
        assert row.count() == 1 and "complaints" in row.inner_text()
        page.screenshot(path=str(ARTIFACTS / "pauses.png"), full_page=True)

        page.goto(f"{base}/admin/messages/{waiting.id}")
        held = page.inner_text("#held")
        assert f"Tenant acme ({acme.id}) is paused" in held and "(complaints)" in held
        page.screenshot(path=str(ARTIFACTS / "paused-message.png"))

        page.click("nav >> text=Pauses")
        page.click("button:has-text('Resume…')")
        page.click("button:has-text('Yes, resume')")
        assert f"Resumed tenant acme ({acme.id})." in page.inner_text(".flash")
        assert "Nothing is paused" in page.inner_text("main")
        page.goto(f"{base}/admin/messages/{waiting.id}")
        assert page.locator("#held").count() == 0
        context.close()
