"""Reading what an operator submitted: form bodies, list filters, ids.

Forms are parsed here rather than through FastAPI's Form(), which needs python-multipart;
the console only ever sends application/x-www-form-urlencoded.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request

from mailbag.domain.message import Filter
from mailbag.domain.states import Status

FILTER_FIELDS = ("state", "tenant", "to", "template", "created_from", "created_to")
MAX_FIELDS = 50


class BadForm(Exception):
    """The request body is not a console form."""


async def read_form(request: Request) -> dict[str, str]:
    """The first value of each field (the app's body limit already bounds the size)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await request.body()
    if not body:
        return {}
    if content_type != "application/x-www-form-urlencoded":
        raise BadForm("expected a form (application/x-www-form-urlencoded)")
    try:
        pairs = parse_qsl(
            body.decode(), keep_blank_values=True, strict_parsing=True, max_num_fields=MAX_FIELDS
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadForm("the form could not be read") from exc
    form: dict[str, str] = {}
    for name, value in pairs:
        form.setdefault(name, value)
    return form


def parse_id(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class FilterForm:
    """A list filter as typed (to fill the form again) and as the service takes it."""

    values: dict[str, str]
    filter: Filter
    errors: dict[str, str] = field(default_factory=dict)

    def query(self, **extra: str) -> str:
        """The filter as a query string, for links that keep it (pagination)."""
        return urlencode({**{k: v for k, v in self.values.items() if v}, **extra})


def parse_filter(source: Mapping[str, str]) -> FilterForm:
    values = {name: source.get(name, "").strip() for name in FILTER_FIELDS}
    errors: dict[str, str] = {}
    status: Status | None = None
    if values["state"]:
        try:
            status = Status(values["state"])
        except ValueError:
            errors["state"] = "not a state"
    created_from = _moment(values["created_from"], "created_from", errors, end_of_day=False)
    created_to = _moment(values["created_to"], "created_to", errors, end_of_day=True)
    return FilterForm(
        values=values,
        filter=Filter(
            status=status,
            tenant_id=values["tenant"] or None,
            to=values["to"] or None,
            template=values["template"] or None,
            created_from=created_from,
            created_to=created_to,
        ),
        errors=errors,
    )


def _moment(value: str, name: str, errors: dict[str, str], *, end_of_day: bool) -> datetime | None:
    """A date (a whole UTC day; "to" includes it) or an ISO datetime (UTC if no zone)."""
    if not value:
        return None
    try:
        day = date.fromisoformat(value)
    except ValueError:
        pass
    else:
        start = datetime.combine(day, time(), tzinfo=UTC)
        return start + timedelta(days=1) if end_of_day else start
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        errors[name] = "use YYYY-MM-DD or an ISO date and time"
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
