"""/docs and /redoc work offline: the pages reference only the app's own URLs, the assets come
from the installed fastapi-offline package, and in Chromium with every request to anywhere but
the app refused, Swagger UI and ReDoc still render the operations (issue 12)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from api_helpers import api_client, settings_for
from mailbag.api import create_app
from servers import uvicorn_thread
from test_console_browser import chromium  # noqa: F401 (the fixture)

pytestmark = pytest.mark.parametrize("db", ["sqlite"], indirect=True)

ABSOLUTE_URL = re.compile(r"(?:https?:)?//[^\s'\"<>]+")
ASSET_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
}


class References(HTMLParser):
    """Every src and href in a page."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href") and v is not None]


def references(html: str) -> list[str]:
    parser = References()
    parser.feed(html)
    return parser.urls


@pytest.mark.parametrize(
    ("page", "assets"),
    [
        ("/docs", {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"}),
        ("/redoc", {"redoc.standalone.js", "favicon.png"}),
    ],
)
async def test_a_docs_page_references_only_the_apps_own_assets(db, page, assets):
    async with api_client(db) as client:
        response = await client.get(page)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        policy = response.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "img-src 'self' data:" in policy
        html = response.text
        # Not a single absolute URL anywhere in the page, scripts included.
        assert ABSOLUTE_URL.findall(html) == []
        urls = references(html)
        assert {url.rsplit("/", 1)[-1] for url in urls} == assets
        for url in urls:
            assert url.startswith("/docs/static/"), url
            asset = await client.get(url)
            assert asset.status_code == 200, url
            suffix = url[url.rindex(".") :]
            assert asset.headers["content-type"].startswith(ASSET_TYPES[suffix]), url
            assert len(asset.content) > 1000, url
        assert "/openapi.json" in html


async def test_swagger_ui_is_version_5_and_has_its_oauth2_redirect_page(db):
    async with api_client(db) as client:
        bundle = (await client.get("/docs/static/swagger-ui-bundle.js")).text
        # Swagger UI 5 renders OpenAPI 3.1 (FastAPI's schema); 4 shows "Unable to render".
        assert re.search(r'PACKAGE_VERSION:"5\.\d+\.\d+"', bundle), "not Swagger UI 5"
        assert (await client.get("/openapi.json")).json()["openapi"].startswith("3.1")
        redirect = await client.get("/docs/oauth2-redirect")
        assert redirect.status_code == 200
        assert "swaggerUIRedirectOauth2" in redirect.text
        page = (await client.get("/docs")).text
        assert "'/docs/oauth2-redirect'" in page
        # The online validator badge would send the schema's URL to validator.swagger.io.
        assert '"validatorUrl": null' in page
        # Nothing outside the package's static directory is served from the mount.
        escape = await client.get("/docs/static/../core.py")
        assert escape.status_code == 404
        assert (await client.get("/docs/static/nope.js")).status_code == 404


async def test_the_docs_follow_a_root_path_set_by_a_proxy(db):
    """Behind a proxy that strips /mail, the browser must be sent to /mail/... URLs."""
    app = create_app(settings_for(db))
    transport = httpx.ASGITransport(app=app, root_path="/mail")
    async with httpx.AsyncClient(transport=transport, base_url="http://mailbag.test") as client:
        html = (await client.get("/mail/docs")).text
    urls = references(html)
    assert urls and all(url.startswith("/mail/docs/static/") for url in urls)
    assert "'/mail/openapi.json'" in html
    assert "'/mail/docs/oauth2-redirect'" in html


def offline_page(browser: Any, base: str) -> tuple[Any, list[str], list[str]]:
    """A page whose every request off the app is refused and recorded, with its JS errors.
    What the page's Content-Security-Policy stopped before any request is in
    `window.blocked` (the browser makes no request for it, so the route never sees it)."""
    page = browser.new_page()
    page.add_init_script(
        "window.blocked = [];"
        "document.addEventListener('securitypolicyviolation',"
        " (e) => window.blocked.push(e.blockedURI));"
    )
    page.set_default_timeout(15_000)
    refused: list[str] = []
    errors: list[str] = []
    app_host = urlsplit(base).netloc

    def route(route: Any) -> None:
        url = route.request.url
        if urlsplit(url).netloc == app_host:
            route.continue_()
        else:
            refused.append(url)
            route.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return page, refused, errors


def test_swagger_ui_renders_the_operations_in_chromium_offline(db, chromium):  # noqa: F811
    app = create_app(settings_for(db))
    with uvicorn_thread(app) as base:
        page, refused, errors = offline_page(chromium, base)
        seen: list[str] = []
        page.on("request", lambda request: seen.append(request.url))
        page.goto(f"{base}/docs")
        create = page.locator(".opblock-post", has=page.locator('[data-path="/v1/messages"]'))
        create.first.wait_for()
        assert create.first.locator(".opblock-summary-method").inner_text() == "POST"
        assert page.locator('.opblock-get [data-path="/v1/messages/{message_id}"]').count() == 1
        assert page.locator(".opblock").count() >= 20
        assert "Unable to render" not in page.content()

        # The UI works, not only draws: try GET /healthz from the page.
        health = page.locator(".opblock-get", has=page.locator('[data-path="/healthz"]'))
        health.locator(".opblock-summary-control").click()
        health.locator("button.try-out__btn").click()
        health.locator("button.execute").click()
        status = health.locator(".live-responses-table tbody .response-col_status").first
        status.wait_for()
        assert status.inner_text().strip() == "200"
        assert page.evaluate("window.blocked") == []
        page.close()
    assert refused == []
    assert errors == []
    assert f"{base}/docs/static/swagger-ui-bundle.js" in seen
    assert f"{base}/openapi.json" in seen


def test_redoc_renders_the_operations_in_chromium_offline(db, chromium):  # noqa: F811
    app = create_app(settings_for(db))
    with uvicorn_thread(app) as base:
        page, refused, errors = offline_page(chromium, base)
        page.goto(f"{base}/redoc")
        page.get_by_role("heading", name="Create Message").first.wait_for()
        assert page.get_by_text("/v1/messages", exact=True).count() >= 1
        # ReDoc's one reach outside: Redocly's logo. The page's policy stops it in the
        # browser, and ReDoc hides the image that did not load.
        page.wait_for_function("window.blocked.length > 0")
        assert page.evaluate("window.blocked") == ["https://cdn.redoc.ly/redoc/logo-mini.svg"]
        assert page.locator("img[alt='redocly logo']").count() == 0
        page.close()
    assert refused == []
    assert errors == []
