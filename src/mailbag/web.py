"""What the API and the console both read off a request: the process's services and who
is asking. Both import this; neither imports the other."""

from __future__ import annotations

from starlette.requests import Request

from mailbag.services.container import Services


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


def client_address(request: Request) -> str:
    """Who is asking, for throttling: the peer address. Behind a reverse proxy, tell
    uvicorn to trust it (FORWARDED_ALLOW_IPS=<proxy address>) so this is the client's
    address from X-Forwarded-For, not the proxy's (which would share one limit)."""
    return request.client.host if request.client else "unknown"
