"""Event hooks in the operator console through the real app, on each database: the Hooks
page (endpoints, recent deliveries, filters, paging), a delivery's detail, and the replay
action with its confirmation step, CSRF token and audit row."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from api_helpers import api_client, new_tenant, settings_for
from hook_helpers import HOOKS_KEY, BlockingHooks, sent_and_failed, settle_all
from mailbag.api import create_app
from mailbag.domain.hooks import DAction
from mailbag.settings import Settings
from servers import uvicorn_thread
from test_console import PASSWORD, login, token
from test_console_browser import ARTIFACTS, chromium  # noqa: F401 - a fixture

from conftest import TestDB

URL = "https://hooks.acme.example/mailbag"


def endpoint(db: TestDB, tenant: str, *events: str, url: str = URL) -> tuple[uuid.UUID, str]:
    """(endpoint id, secret), made as `mailbag hooks add` makes it."""
    settings = Settings.model_validate({"database_url": db.url, "hooks_key": HOOKS_KEY})
    new = BlockingHooks(db, settings).create_endpoint(
        tenant, url, list(events) or ["sent"], "billing service"
    )
    return new.endpoint.id, new.secret


@asynccontextmanager
async def hooks_console(
    db: TestDB, *, logged_in: bool = True, hooks_key: str | None = HOOKS_KEY
) -> AsyncIterator[httpx.AsyncClient]:
    settings = {"admin_password": PASSWORD, "hooks_key": hooks_key}
    async with api_client(db, **{k: v for k, v in settings.items() if v}) as client:
        if logged_in:
            await login(client)
        yield client


async def test_the_hooks_page_says_when_hooks_are_off(db):
    async with hooks_console(db, hooks_key=None) as client:
        page = await client.get("/admin/hooks")
        assert page.status_code == 200
        assert 'id="hooks-off"' in page.text and "MAILBAG_HOOKS_KEY" in page.text
        assert 'href="/admin/hooks" class="here"' in page.text  # in the nav
        detail = await client.get(f"/admin/hooks/deliveries/{uuid.uuid4()}")
        assert detail.status_code == 404 and "Event hooks are off" in detail.text


async def test_the_hooks_page_lists_endpoints_and_deliveries_without_secrets(db):
    tenant, _ = new_tenant(db, "acme")
    other, _ = new_tenant(db, "globex")
    _, secret = endpoint(db, tenant, "sent", "failed")
    endpoint(db, other, "sent", url="https://globex.example/h")
    sent_and_failed(db, tenant, n_sent=2, n_failed=1)
    sent_and_failed(db, other, n_sent=1)
    async with hooks_console(db) as client:
        page = await client.get("/admin/hooks")
        assert page.status_code == 200, page.text
        assert secret not in page.text and "whsec_" not in page.text
        assert URL in page.text and "https://globex.example/h" in page.text
        assert "failed, sent" in page.text and "billing service" in page.text
        assert page.text.count('href="/admin/hooks/deliveries/') == 4
        assert page.text.count('class="state state-pending"') == 4

        theirs = await client.get("/admin/hooks", params={"tenant": other})
        assert theirs.text.count('href="/admin/hooks/deliveries/') == 1
        failed = await client.get("/admin/hooks", params={"event": "message.failed"})
        assert failed.text.count('href="/admin/hooks/deliveries/') == 1

        # Retrying: the state, the attempts and the last error.
        settle_all(db, DAction.RETRY, status_code=503)
        retrying = await client.get("/admin/hooks", params={"status": "retrying"})
        assert retrying.text.count('class="state state-retrying"') == 4
        assert "HTTP 503" in retrying.text and "1 made, 7 left" in retrying.text
        next_attempts = re.findall(r'<td class="mono">([0-9T:-]+Z)</td>\s*</tr>', retrying.text)
        assert len(next_attempts) == 4  # the last column: when a worker tries again
        assert (await client.get("/admin/hooks?status=dead")).text.count("/deliveries/") == 0

        bad = await client.get("/admin/hooks", params={"status": "lost", "event": "x"})
        assert bad.status_code == 400
        assert "not a delivery state" in bad.text and "not an event" in bad.text
        stale = await client.get("/admin/hooks", params={"cursor": "bogus!"})
        assert stale.status_code == 400 and "start again from the newest" in stale.text


async def test_the_deliveries_are_paged(db, monkeypatch):
    from mailbag.console import hooks as console_hooks

    monkeypatch.setattr(console_hooks, "PAGE_SIZE", 2)
    tenant, _ = new_tenant(db, "acme")
    endpoint(db, tenant, "sent")
    sent_and_failed(db, tenant, n_sent=3)
    async with hooks_console(db) as client:
        first = await client.get("/admin/hooks", params={"tenant": tenant})
        assert first.text.count('href="/admin/hooks/deliveries/') == 2
        older = first.text.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
        assert f"tenant={tenant}" in older and "cursor=" in older
        second = await client.get(older.replace("&amp;", "&"))
        assert second.status_code == 200
        assert second.text.count('href="/admin/hooks/deliveries/') == 1
        assert 'rel="next"' not in second.text and ">Newest</a>" in second.text


async def test_an_operator_replays_a_dead_delivery_after_confirming(db):
    tenant, _ = new_tenant(db, "acme")
    endpoint(db, tenant, "sent")
    (message,) = sent_and_failed(db, tenant, n_sent=1)
    async with hooks_console(db) as client:
        listing = await client.get("/admin/hooks")
        delivery_id = listing.text.split('href="/admin/hooks/deliveries/')[1].split('"')[0]
        url = f"/admin/hooks/deliveries/{delivery_id}"

        pending = await client.get(url)
        assert pending.status_code == 200
        assert f"acme ({tenant})" in pending.text  # the tenant's name, beside its id
        assert 'id="state">pending' in pending.text and "Replay…" not in pending.text
        assert "&#34;type&#34;: &#34;message.sent&#34;" in pending.text  # the body, escaped
        assert str(message.id) in pending.text
        early = await client.post(f"{url}/replay", data={"csrf": await token(client)})
        assert early.status_code == 409 and "Nothing was changed" in early.text

        settle_all(db)  # 410: dead
        dead = await client.get(url)
        assert 'id="state">dead' in dead.text and "Replay…" in dead.text
        assert "HTTP 410" in dead.text and "hooks-test" in dead.text

        forged = await client.post(f"{url}/replay", data={"csrf": "forged", "confirm": "yes"})
        assert forged.status_code == 403
        assert 'id="state">dead' in (await client.get(url)).text

        csrf = await token(client)
        asked = await client.post(f"{url}/replay", data={"csrf": csrf})
        assert asked.status_code == 200 and "Replay this delivery?" in asked.text
        assert f"acme ({tenant})" in asked.text
        assert 'name="confirm" value="yes"' in asked.text
        assert 'id="state">dead' in (await client.get(url)).text  # asking changes nothing
        done = await client.post(f"{url}/replay", data={"csrf": csrf, "confirm": "yes"})
        assert done.status_code == 303 and done.headers["location"] == url
        after = await client.get(url)
        assert 'id="state">pending' in after.text
        # One attempt made before; the replay's fresh budget is all left (it read "1/9").
        assert 'id="attempts">1 made, 8 left' in after.text
        assert "Replayed: the delivery is pending again." in after.text
        assert "operator:console" in after.text  # the history row's actor
        again = await client.post(f"{url}/replay", data={"csrf": csrf, "confirm": "yes"})
        assert again.status_code == 409

        assert (await client.get(f"/admin/hooks/deliveries/{uuid.uuid4()}")).status_code == 404
        assert (await client.get("/admin/hooks/deliveries/not-an-id")).status_code == 404


async def test_the_hooks_pages_need_a_login(db):
    async with hooks_console(db, logged_in=False) as client:
        page = await client.get("/admin/hooks")
        assert page.status_code == 303 and page.headers["location"].startswith("/admin/login")
        replay = await client.post(f"/admin/hooks/deliveries/{uuid.uuid4()}/replay")
        assert replay.status_code == 303


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_an_operator_replays_a_dead_delivery_in_the_browser(db, chromium):  # noqa: F811
    tenant, _ = new_tenant(db, "acme")
    endpoint(db, tenant, "sent")
    sent_and_failed(db, tenant, n_sent=1)
    settle_all(db)  # 410: dead
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    app = create_app(settings_for(db, admin_password=PASSWORD, hooks_key=HOOKS_KEY))
    with uvicorn_thread(app) as base:
        # Scripts on: the console's CSP would report anything of these pages it blocks.
        context = chromium.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(10_000)
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.goto(f"{base}/admin/login?next=/admin")
        page.fill("#password", PASSWORD)
        page.click("button[type=submit]")

        page.click("nav >> text=Hooks")
        assert page.url == f"{base}/admin/hooks"
        assert URL in page.inner_text("#endpoints")
        rows = page.locator("#deliveries tbody tr")
        assert rows.count() == 1 and "dead" in rows.first.inner_text()
        page.screenshot(path=str(ARTIFACTS / "hooks.png"), full_page=True)

        rows.first.locator("a").click()
        assert page.inner_text("#state") == "dead"
        assert "HTTP 410" in page.inner_text("#last-error")
        page.click("button:has-text('Replay…')")
        assert "Replay this delivery?" in page.inner_text("h1")
        page.click("button:has-text('Yes, replay this delivery')")
        assert page.inner_text("#state") == "pending"
        assert "Replayed" in page.inner_text(".flash")
        assert "operator:console" in page.inner_text("#history")
        page.screenshot(path=str(ARTIFACTS / "hook-delivery.png"), full_page=True)
        assert problems == []
        context.close()
