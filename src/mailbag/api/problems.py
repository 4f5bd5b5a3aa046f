"""RFC 9457 problem details: every error the API returns, with a stable `type` each."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

PROBLEM_BASE = "https://mailbag.dev/problems/"
MEDIA_TYPE = "application/problem+json"


class Problem(BaseModel):
    """The body of every error response."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None


class ProblemError(Exception):
    """Raise anywhere in a request to answer with a problem+json response."""

    def __init__(
        self,
        status: int,
        slug: str,
        title: str,
        detail: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail or title)
        self.status, self.slug, self.title, self.detail = status, slug, title, detail
        self.headers = headers or {}
        self.extra = extra


def problem_response(
    status: int,
    slug: str,
    title: str,
    detail: str | None = None,
    *,
    instance: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {"type": PROBLEM_BASE + slug, "title": title, "status": status}
    if detail is not None:
        body["detail"] = detail
    if instance is not None:
        body["instance"] = instance
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer with."""
    return {
        status: {"model": Problem, "content": {MEDIA_TYPE: {}}, "description": "A problem."}
        for status in statuses
    }


# Statuses any authenticated route may answer with.
COMMON = (400, 401, 413, 415, 422, 500, 503)
