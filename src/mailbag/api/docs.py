"""/docs and /redoc: Swagger UI and ReDoc served from the installed `fastapi-offline` package
(issue 12), so the pages work without internet access and load nothing from a CDN."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
STATIC_URL = "/docs/static"
# swagger-ui-bundle.js, swagger-ui.css (Swagger UI 5, which renders OpenAPI 3.1),
# redoc.standalone.js and favicon.png.
ASSETS = Path(str(files("fastapi_offline") / "static"))
# The browser itself refuses anything from elsewhere: ReDoc's sidebar shows Redocly's logo
# from their CDN (it hides the image when it does not load); the pages' inline scripts and
# styles are FastAPI's and the bundles'.
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "worker-src 'self' blob:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
    )
)


def install(app: FastAPI) -> None:
    """Add /docs (Swagger UI, with its OAuth2 redirect page) and /redoc (ReDoc) to `app`,
    each pointing only at the app's own URLs."""
    if app.openapi_url is None:  # no schema, nothing to document
        return
    app.mount(STATIC_URL, StaticFiles(directory=ASSETS), name="docs-static")
    oauth2_redirect_url = app.swagger_ui_oauth2_redirect_url
    _page(
        app,
        DOCS_URL,
        "swagger_ui",
        get_swagger_ui_html,
        "Swagger UI",
        {
            "swagger_js_url": f"{STATIC_URL}/swagger-ui-bundle.js",
            "swagger_css_url": f"{STATIC_URL}/swagger-ui.css",
            "swagger_favicon_url": f"{STATIC_URL}/favicon.png",
            "oauth2_redirect_url": oauth2_redirect_url,
        },
        init_oauth=app.swagger_ui_init_oauth,
        # No validator.swagger.io badge: it would send the schema's URL to a third party.
        swagger_ui_parameters={"validatorUrl": None, **(app.swagger_ui_parameters or {})},
    )

    if oauth2_redirect_url:

        @app.get(oauth2_redirect_url, include_in_schema=False)
        async def swagger_ui_oauth2_redirect() -> HTMLResponse:
            return get_swagger_ui_oauth2_redirect_html()

    _page(
        app,
        REDOC_URL,
        "redoc",
        get_redoc_html,
        "ReDoc",
        {
            "redoc_js_url": f"{STATIC_URL}/redoc.standalone.js",
            "redoc_favicon_url": f"{STATIC_URL}/favicon.png",
        },
        with_google_fonts=False,  # fonts.googleapis.com is a third party too
    )


def _page(
    app: FastAPI,
    path: str,
    name: str,
    render: Callable[..., HTMLResponse],
    kind: str,
    links: Mapping[str, str | None],
    **options: Any,
) -> None:
    """Serve at `path` (route `name`) the page `render` makes of the app's schema, titled
    "<app> - <kind>", with `links` (the app's own paths; None for one it has not) and
    `options` passed on, under CONTENT_SECURITY_POLICY."""
    openapi_url = app.openapi_url

    @app.get(path, include_in_schema=False, name=name)
    async def docs_page(request: Request) -> HTMLResponse:
        # Behind a proxy that strips a prefix, the browser needs the prefix back.
        root = request.scope.get("root_path", "")
        rooted = {key: f"{root}{link}" if link else None for key, link in links.items()}
        page = render(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - {kind}",
            **rooted,
            **options,
        )
        page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        return page
