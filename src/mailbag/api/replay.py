"""Turning a (possibly replayed) idempotent result into the HTTP answer."""

from __future__ import annotations

from typing import Any

from fastapi import Response

from mailbag import metrics
from mailbag.services.idempotency import Response as Result


def replayed(result: Result, response: Response, operation: str) -> Any:
    response.status_code = result.status
    if result.replayed:
        response.headers["Idempotent-Replayed"] = "true"
        metrics.IDEMPOTENT_REPLAYS.labels(operation).inc()
    return result.body
