"""POST /v1/messages/batch: many messages in one request and one transaction (issue 12)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
