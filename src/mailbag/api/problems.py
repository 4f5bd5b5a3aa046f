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
    """A problem: raise it anywhere in a request, or answer with its `response()`."""

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

    def body(self) -> dict[str, Any]:
        """The problem as JSON: a response's body, or an invalid batch item's `error`."""
        body: dict[str, Any] = {
            "type": PROBLEM_BASE + self.slug,
            "title": self.title,
            "status": self.status,
        }
        if self.detail is not None:
            body["detail"] = self.detail
        body.update(self.extra)
        return body

    def response(self) -> JSONResponse:
        return JSONResponse(
            self.body(), status_code=self.status, media_type=MEDIA_TYPE, headers=self.headers
        )


def not_found(detail: str) -> ProblemError:
    return ProblemError(404, "not-found", "Not found", detail)


def unauthorized(detail: str, challenge: str) -> ProblemError:
    """401 with the WWW-Authenticate challenge that says which credentials to send."""
    return ProblemError(
        401, "unauthorized", "Unauthorized", detail, headers={"WWW-Authenticate": challenge}
    )


def too_many_attempts(retry_after: int) -> ProblemError:
    return ProblemError(
        429,
        "too-many-attempts",
        "Too many failed attempts",
        f"too many wrong credentials; try again in {retry_after} s",
        headers={"Retry-After": str(retry_after)},
    )


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer with."""
    return {
        status: {"model": Problem, "content": {MEDIA_TYPE: {}}, "description": "A problem."}
        for status in statuses
    }


# Statuses any authenticated route may answer with.
COMMON = (400, 401, 413, 415, 422, 500, 503)
