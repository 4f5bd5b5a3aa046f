"""A real HTTP server for tests that plays an ESP's JSON API (postmark_server, resend_server).

It listens on 127.0.0.1 (a free port) in a background thread and speaks HTTP/1.1 with
keep-alive, so a provider under test goes through its real connection pool, timeouts and
error paths. Every request is checked against the ESP's OpenAPI document with openapi-core
(`violations` lists what did not conform; the tests' fixtures assert it stays empty), then
answered by the subclass's `answer`.

Failure injection, for the next matching requests in the order added: `fail_next` answers
a status/body/headers without processing; `hang_after_accept` processes the request (what
it sends counts as sent) and holds the answer past the client's timeout;
`drop_after_accept` processes it and closes the connection without answering.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import parse_qsl, urlsplit

from openapi_core import OpenAPI
from openapi_core.testing import MockRequest

from http_server import PeerHTTPServer

Json = Any
SPECS = Path(__file__).parent / "data" / "specs"


@functools.cache
def read_spec(spec_file: str) -> OpenAPI:
    """A spec of tests/data/specs, checked and read once a test run (Mailgun's takes 0.15 s)."""
    return OpenAPI.from_path((SPECS / spec_file).resolve())


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str  # without the query
    query: dict[str, str]
    headers: dict[str, str]  # names in lower case
    body: bytes
    json: Json  # the parsed body; None when there was none or it was not JSON


@dataclass(frozen=True)
class Reply:
    status: int
    body: Json
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Fault:
    kind: Literal["respond", "hang", "drop"]
    matches: Callable[[RecordedRequest], bool]
    remaining: int
    reply: Reply | None = None
    hang_seconds: float = 0.0


class FakeESP:
    """Subclasses set `spec_file` (in tests/data/specs), `host_url` (the spec's server)
    and implement `answer` (called with the lock held)."""

    spec_file: str
    host_url: str
    name = "esp"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._release = threading.Event()  # lets held (hanging) answers go at once
        self._requests: list[RecordedRequest] = []
        self._violations: list[str] = []
        self._faults: list[_Fault] = []
        self._openapi = self.openapi()
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def openapi(self) -> OpenAPI:
        """The spec requests are checked against, read once per test run (a subclass may
        read its own differently)."""
        return read_spec(self.spec_file)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        http = PeerHTTPServer(("127.0.0.1", 0), _Handler)
        http.esp = self  # type: ignore[attr-defined]
        self._http = http
        self._thread = threading.Thread(
            target=http.serve_forever, kwargs={"poll_interval": 0.05}, name=f"{self.name}-server"
        )
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._http = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._http is not None, "start the server first"
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    # --- what happened -----------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def violations(self) -> list[str]:
        """Why each request that did not conform to the spec did not (empty: all did)."""
        with self._lock:
            return list(self._violations)

    # --- failure injection -------------------------------------------------------------

    def fail_next(
        self,
        status: int,
        body: Json,
        *,
        headers: dict[str, str] | None = None,
        times: int = 1,
        matches: Callable[[RecordedRequest], bool] = lambda request: request.method == "POST",
    ) -> None:
        """The next `times` matching requests get this answer and are not processed."""
        self._add(_Fault("respond", matches, times, Reply(status, body, dict(headers or {}))))

    def hang_after_accept(self, *, times: int = 1, seconds: float = 10.0) -> None:
        self._add(_Fault("hang", lambda r: r.method == "POST", times, hang_seconds=seconds))

    def drop_after_accept(self, *, times: int = 1) -> None:
        self._add(_Fault("drop", lambda r: r.method == "POST", times))

    def _add(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _take_fault(self, request: RecordedRequest, kinds: set[str]) -> _Fault | None:
        for fault in self._faults:
            if fault.matches(request):
                if fault.kind not in kinds:
                    return None
                fault.remaining -= 1
                if fault.remaining == 0:
                    self._faults.remove(fault)
                return fault
        return None

    # --- the API -----------------------------------------------------------------------

    def answer(self, request: RecordedRequest) -> Reply:  # pragma: no cover - abstract
        raise NotImplementedError

    def invalid(self, request: RecordedRequest, problem: str) -> Reply:
        """The ESP's answer to a request its spec refuses (a subclass says it its way)."""
        return Reply(422, {"message": problem})

    def handle(self, request: RecordedRequest) -> tuple[Reply, _Fault | None]:
        with self._lock:
            self._requests.append(request)
            injected = self._take_fault(request, {"respond"})
            if injected is not None and injected.reply is not None:
                return injected.reply, None
            problem = self._conforms(request)
            if problem is not None:
                self._violations.append(f"{request.method} {request.path}: {problem}")
                return self.invalid(request, problem), None
            reply = self.answer(request)
            after = self._take_fault(request, {"hang", "drop"}) if reply.status < 300 else None
            return reply, after

    def _conforms(self, request: RecordedRequest) -> str | None:
        mock = MockRequest(
            self.host_url,
            request.method.lower(),
            request.path,
            args=request.query,
            headers=request.headers,
            data=request.body or None,
            content_type=request.headers.get("content-type", "application/json"),
        )
        try:
            self._openapi.validate_request(mock)
        except Exception as exc:  # openapi-core's errors name the offending part
            cause = exc.__cause__ or exc.__context__
            return f"{exc}" + (f" ({cause})" if cause else "")
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the real APIs
    server: ThreadingHTTPServer

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        return None

    def _serve(self) -> None:
        esp: FakeESP = self.server.esp  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            parsed: Json = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        url = urlsplit(self.path)
        request = RecordedRequest(
            method=self.command,
            path=url.path,
            query=dict(parse_qsl(url.query)),
            headers={name.lower(): value for name, value in self.headers.items()},
            body=raw,
            json=parsed,
        )
        reply, fault = esp.handle(request)
        if fault is not None and fault.kind == "drop":
            self.close_connection = True  # processed, and no answer at all
            return
        if fault is not None and fault.kind == "hang":
            esp._release.wait(fault.hang_seconds)
            self.close_connection = True
        payload = json.dumps(reply.body).encode() if reply.body is not None else b""
        try:
            self.send_response(reply.status)
            self.send_header("content-type", "application/json; charset=utf-8")
            self.send_header("content-length", str(len(payload)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the client gave up (a held answer): nothing to tell
            self.close_connection = True
