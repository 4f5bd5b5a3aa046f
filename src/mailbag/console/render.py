"""HTML out: the Jinja2 environment (autoescaped), display filters and security headers."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from starlette.responses import HTMLResponse

from mailbag.domain.message import DEFAULT_TENANT

TEMPLATES = Path(__file__).parent / "templates"

# Nothing but this origin's forms and inline styles: a message preview (which inherits this
# policy in its srcdoc frame) cannot run scripts or fetch tracking pixels.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# An attachment download: bytes to save, never a document of the console's origin (the
# `sandbox` directive makes it an opaque origin even if a browser ever displayed it).
DOWNLOAD_HEADERS = {
    **SECURITY_HEADERS,
    "Content-Security-Policy": "default-src 'none'; sandbox",
}


def utc(value: datetime | str | None) -> str:
    """Every time the console shows: ISO 8601 in UTC, to the second."""
    if value is None or value == "":
        return "—"
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    if moment.tzinfo is None:  # the store hands back UTC; a naive value is UTC too
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d"] if days else []
    if hours or days:
        parts.append(f"{hours}h")
    if not days:
        parts.append(f"{minutes}m")
    if not (days or hours):
        parts.append(f"{secs}s")
    return " ".join(parts)


def size(n: int | None) -> str:
    """A byte count as people read it (binary units, as the size limits are set)."""
    if n is None:
        return "—"
    if n < 1024:
        return f"{n} bytes"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def percent(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio * 100:.1f}%"


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def tenant_label(tenant_id: str, names: Mapping[str, str]) -> str:
    """How the console shows a tenant: its name, then its id; an id no tenant has is marked
    so (rows written before tenants were checked may carry a name or a typo)."""
    if tenant_id == DEFAULT_TENANT:
        return tenant_id
    name = names.get(tenant_id)
    return f"{name} ({tenant_id})" if name is not None else f"{tenant_id} (no such tenant)"


@jinja2.pass_context
def _tenant(context: jinja2.runtime.Context, tenant_id: str) -> str:
    """`{{ m.tenant_id | tenant }}`, with the names the page was given (Console.page)."""
    return tenant_label(tenant_id, context.get("tenant_names") or {})


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters.update(
    utc=utc, duration=duration, percent=percent, as_json=as_json, size=size, tenant=_tenant
)


def refused(status: int, title: str, detail: str) -> HTMLResponse:
    """A console request refused before the console saw it (a form over MAX_BODY_BYTES):
    a page of its own, needing no session, instead of the API's problem+json."""
    return html("refused.html", status=status, title=title, detail=detail)


def html(template: str, *, status: int = 200, **context: Any) -> HTMLResponse:
    body = _env.get_template(template).render(**context)
    return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)
