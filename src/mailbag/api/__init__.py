"""The HTTP API (FastAPI): `create_app` builds it from settings."""

from mailbag.api.app import create_app

__all__ = ["create_app"]
