"""A real HTTP receiver of event hooks for the tests: it verifies each POST's Standard
Webhooks signature with mailbag.domain.hooks.verify, as a user's receiver would, and
records what it accepted by webhook-id.

    with HookReceiver(secret) as receiver:       # http://127.0.0.1:<port>/hooks
        ...
        receiver.wait_for(lambda r: len(r.ids()) == 10)

`fail_first`: answer `fail_status` to the first N POSTs of each webhook-id (then 204);
`delay`: wait that long before answering (a worker can be killed meanwhile); `answer_body`:
the body of every answer (an internal service's secrets, say). A POST whose signature does
not verify is answered 401 and counted in `rejected`.

`tls` (an ssl.SSLContext with the receiver's certificate) serves https; `host` names the
receiver in `url` (resolved by the test's DNS server); `hosts` and `server_names` keep each
request's Host header and each TLS handshake's SNI.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from http_server import PeerHTTPServer
from mailbag.domain.hooks import InvalidSignature, verify


@dataclass(frozen=True)
class Received:
    webhook_id: str
    timestamp: int
    body: dict[str, Any]
    answered: int


class HookReceiver:
    def __init__(
        self,
        secret: str = "",
        *,
        fail_first: int = 0,
        fail_status: int = 503,
        delay: float = 0.0,
        path: str = "/hooks",
        answer_body: bytes = b"",
        tls: ssl.SSLContext | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.secret, self.fail_first, self.fail_status = secret, fail_first, fail_status
        self.delay, self.path, self.answer_body, self.host = delay, path, answer_body, host
        self.hosts: list[str] = []
        self.server_names: list[str | None] = []
        self.lock = threading.Lock()
        self.received: list[Received] = []  # every verified POST, in arrival order
        self.rejected = 0
        self.torn = 0  # requests cut off before their body's end (a killed sender's)
        self.in_flight = 0  # verified POSTs not answered yet (waiting out `delay`)
        self.attempts: Counter[str] = Counter()  # verified POSTs per webhook-id
        self.server = PeerHTTPServer(("127.0.0.1", 0), self._handler())
        self.scheme = "https" if tls else "http"
        if tls is not None:
            tls.sni_callback = lambda sock, name, ctx: self.server_names.append(name)
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.server.server_address[1]}{self.path}"

    def __enter__(self) -> HookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def delivered(self) -> list[Received]:
        """The POSTs answered 2xx."""
        with self.lock:
            return [r for r in self.received if 200 <= r.answered < 300]

    def ids(self) -> set[str]:
        """The webhook-ids answered 2xx at least once."""
        return {r.webhook_id for r in self.delivered()}

    def wait_for(
        self, condition: Callable[[HookReceiver], bool], timeout: float = 60.0, what: str = ""
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition(self):
                return
            time.sleep(0.05)
        raise TimeoutError(f"receiver: {what or 'condition'} not met in {timeout} s")

    def _answer(self, headers: dict[str, str], body: bytes) -> int:
        try:
            webhook_id = verify(self.secret, headers, body)
        except (InvalidSignature, ValueError):
            with self.lock:
                self.rejected += 1
            return 401
        if self.delay:
            with self.lock:
                self.in_flight += 1
            time.sleep(self.delay)
        with self.lock:
            self.in_flight -= 1 if self.delay else 0
            self.attempts[webhook_id] += 1
            status = self.fail_status if self.attempts[webhook_id] <= self.fail_first else 204
            self.received.append(
                Received(webhook_id, int(headers["webhook-timestamp"]), json.loads(body), status)
            )
        return status

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                if len(body) < length:  # the sender died mid-request: nothing to verify
                    with receiver.lock:
                        receiver.torn += 1
                    return
                with receiver.lock:
                    receiver.hosts.append(self.headers.get("host", ""))
                if self.path != receiver.path:
                    status = 404
                else:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    status = receiver._answer(headers, body)
                self.send_response(status)
                self.send_header("content-length", str(len(receiver.answer_body)))
                self.end_headers()
                self.wfile.write(receiver.answer_body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        return Handler
