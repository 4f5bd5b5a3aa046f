"""The admin API of event hooks: endpoints, secrets and deliveries (issue 12)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
