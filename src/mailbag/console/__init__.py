"""The operator console at /admin: server-rendered pages that work without JavaScript.

It is on only when ADMIN_PASSWORD is set; `router(settings)` gives the routes to include.
"""

from mailbag.console.routes import router

__all__ = ["router"]
