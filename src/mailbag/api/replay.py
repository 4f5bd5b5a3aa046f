"""Turning a (possibly replayed) idempotent result into the HTTP answer."""

from __future__ import annotations

from typing import Any

from fastapi import Response

from mailbag.services.idempotency import Response as Result


def replayed(result: Result, response: Response) -> Any:
    response.status_code = result.status
    if result.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return result.body
