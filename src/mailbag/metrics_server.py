"""The worker's Prometheus endpoint (`mailbag worker --metrics-port N`), on its own port.

prometheus_client's WSGI app, served from a daemon thread as its `start_http_server` does,
but behind the same rule as the API's /metrics: with METRICS_TOKEN set, only a request with
`Authorization: Bearer <METRICS_TOKEN>` gets the metrics, any other a 401 (problem+json,
like the API's); unset, it is open. The token is compared by `keys.bearer_matches`, the
API's own check. Under prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR set)
it serves the series of every process writing there, as the API's /metrics does.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from mailbag import metrics
from mailbag.keys import bearer_matches

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

    from pydantic import SecretStr

# The body of the API's 401 for /metrics (mailbag.api.problems, without importing FastAPI).
# The API's /metrics gives the same 401 (api/app.py reads these two).
UNAUTHORIZED_DETAIL = "send `Authorization: Bearer <METRICS_TOKEN>`"
CHALLENGE = 'Bearer realm="mailbag metrics"'
UNAUTHORIZED = json.dumps(
    {
        "type": "https://mailbag.dev/problems/unauthorized",
        "title": "Unauthorized",
        "status": 401,
        "detail": UNAUTHORIZED_DETAIL,
    }
).encode()
UNAUTHORIZED_HEADERS = [
    ("Content-Type", "application/problem+json"),
    ("Content-Length", str(len(UNAUTHORIZED))),
    ("WWW-Authenticate", CHALLENGE),
]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds up the worker's exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access lines on stderr: the worker's log is JSON, and a scrape is not news."""


def require_bearer(app: WSGIApplication, token: SecretStr) -> WSGIApplication:
    """`app` for requests that carry the token; 401 for any other."""

    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if bearer_matches(environ.get("HTTP_AUTHORIZATION"), token):
            return app(environ, start_response)
        start_response("401 Unauthorized", UNAUTHORIZED_HEADERS)
        return [UNAUTHORIZED]

    return guarded


def start(host: str, port: int, token: SecretStr | None) -> WSGIServer:
    """Listen now (an error, such as a port in use, is raised here) and serve from a daemon
    thread until `server.shutdown()`."""
    app = make_wsgi_app(metrics.registry())
    if token is not None:
        app = require_bearer(app, token)
    # The address family the host needs (an IPv6 address cannot be bound as AF_INET).
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    server_class: type[_Server] = type("MetricsServer", (_Server,), {"address_family": family})
    server = make_server(str(sockaddr[0]), port, app, server_class, _QuietHandler)
    threading.Thread(target=server.serve_forever, name="mailbag metrics", daemon=True).start()
    return server
