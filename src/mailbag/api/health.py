"""Health: `/healthz` (the process is up) and `/readyz` (its database is reachable and its
schema current), for load balancers and orchestrators; no key needed."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from mailbag.api.problems import DATABASE_DOWN, RETRY_AFTER_SECONDS
from mailbag.services.container import Services
from mailbag.store import migrate

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "Not ready."}})
async def readyz(request: Request) -> Response:
    """The database is reachable and its schema is current."""
    svc: Services = request.app.state.services
    try:
        async with svc.engine.connect() as conn:
            current = await conn.run_sync(lambda sync: migrate.is_current(sync))
    except DATABASE_DOWN as exc:
        return JSONResponse(
            {"status": "database unreachable", "error": type(exc).__name__},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if not current:
        return JSONResponse({"status": "schema not current"}, status_code=503)
    return JSONResponse({"status": "ready"})
