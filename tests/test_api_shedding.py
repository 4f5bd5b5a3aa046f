"""Hostile clients against a real uvicorn serving mailbag as `serve` and `api` do
(runtime.uvicorn_options): each test drives raw sockets by hand, byte by byte where it
matters, with the API_* limits set small so that each takes a second or two."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from api_helpers import new_tenant, settings_for
from mailbag import runtime
from mailbag.api import create_app
from servers import free_port, mailbag_env, start_mailbag, stop, wait_until_up

from conftest import TestDB

KIB = 1024
MESSAGE = {"to": "ada@example.com", "template": "welcome", "data": {"name": "Ada"}}


@contextlib.contextmanager
def serving(db: TestDB, **overrides: Any) -> Iterator[int]:
    """The app under uvicorn with mailbag's own options, in a thread; yields its port."""
    settings = settings_for(db, api_port=free_port(), **overrides)
    options = runtime.uvicorn_options(settings)
    options.update(app=create_app(settings), factory=False)
    server = uvicorn.Server(uvicorn.Config(**options, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until_up(f"http://127.0.0.1:{settings.api_port}/healthz")
        yield settings.api_port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def problem(self) -> dict[str, Any]:
        assert self.headers["content-type"] == "application/problem+json", self.headers
        found: dict[str, Any] = json.loads(self.body)
        return found


class Client:
    """One connection, driven by hand: it sends exactly what a test says, when it says."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request_head(self, method: str, path: str, headers: dict[str, str] | None = None) -> None:
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self.send(("\r\n".join(lines) + "\r\n\r\n").encode())

    def answer(self) -> Answer:
        while b"\r\n\r\n" not in self.buffer:
            self._more()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._more()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return Answer(int(status_line.split()[1]), headers, body)

    def is_closed(self, wait: float) -> bool:
        """Does the server close the connection within `wait` seconds? (What it sends
        meanwhile is kept for `answer`.)"""
        deadline = time.monotonic() + wait
        try:
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                data = self.sock.recv(65536)
                if not data:
                    return True
                self.buffer += data
            return False
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
        finally:
            self.sock.settimeout(10)

    def close(self) -> None:
        self.sock.close()

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed before a whole answer")
        self.buffer += data


def json_body(size: int) -> bytes:
    """A valid message, padded with JSON whitespace to `size` bytes."""
    body = json.dumps(MESSAGE).encode()
    return body + b" " * (size - len(body))


def post_head(size: int, key: str | None = None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Content-Length": str(size)}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def seconds_until_closed(client: Client, bound: float = 10.0) -> float:
    started = time.monotonic()
    assert client.is_closed(bound), f"still open after {bound} s"
    return time.monotonic() - started


# --- the key before a large body -----------------------------------------------------------


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
@pytest.mark.parametrize("authorization", [None, "Bearer mb_not-a-key", "Basic YTpi"])
def test_a_large_post_without_a_valid_key_is_a_401_before_its_body_is_sent(db, authorization):
    size = 21 * 1024 * KIB
    with serving(db) as port:
        client = Client(port)
        headers = {**post_head(size), "Expect": "100-continue"}
        if authorization is not None:
            headers["Authorization"] = authorization
        client.request_head("POST", "/v1/messages", headers)
        # Not one byte of the body has left: the answer comes anyway, and no "100 Continue"
        # came before it, which uvicorn sends when the app first reads the body.
        answer = client.answer()
        closed = client.is_closed(5)
    assert answer.status == 401
    assert answer.problem()["type"].endswith("/unauthorized")
    assert answer.headers["www-authenticate"] == 'Bearer realm="mailbag"'
    assert answer.headers["connection"] == "close" and closed


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_chunked_post_without_a_key_is_refused_once_past_the_common_limit(db):
    with serving(db, max_body_bytes=64 * KIB) as port:
        client = Client(port)
        headers = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
        client.request_head("POST", "/v1/messages", headers)
        chunk = b" " * (16 * KIB)
        for _ in range(5):  # 80 KiB: past the 64 KiB any request may send without a key
            client.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = client.answer()  # without the chunks still to come, or the last one
        closed = client.is_closed(5)
    assert answer.status == 401 and closed


@pytest.mark.parametrize("db", ["sqlite", "postgresql", "mysql"], indirect=True)
def test_a_keyed_post_past_the_common_limit_is_read_and_stored(db):
    _, key = new_tenant(db)
    size = 300 * KIB  # past MAX_BODY_BYTES (256 KiB): the key is checked before the body
    with serving(db) as port:
        client = Client(port)
        client.request_head("POST", "/v1/messages", post_head(size, key))
        client.send(json_body(size))
        answer = client.answer()
        # The connection is kept for the next request.
        client.request_head("GET", "/healthz")
        again = client.answer()
    assert answer.status == 201, answer.body[:300]
    assert again.status == 200


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_keyed_messages_at_the_limits_get_through_whole_and_chunked(db):
    _, key = new_tenant(db)
    content = bytes(range(256)) * (10 * 1024 * KIB // 256 - 64)  # 10 MiB less the bodies' room
    message = {
        "to": "ada@example.com",
        "subject": "The report",
        "html": "<p>hi</p>",
        "attachments": [{"filename": "big.bin", "content": base64.b64encode(content).decode()}],
    }
    payload = json.dumps(message).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def pieces() -> Iterator[bytes]:
        for start in range(0, len(payload), 1024 * KIB):
            yield payload[start : start + 1024 * KIB]

    with serving(db) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
        whole = http.post("/v1/messages", content=payload, headers=headers, timeout=60)
        chunked = http.post("/v1/messages", content=pieces(), headers=headers, timeout=60)
    assert whole.status_code == 201, whole.text[:300]
    assert whole.json()["attachments"][0]["size"] == len(content)
    assert chunked.request.headers["transfer-encoding"] == "chunked"
    assert chunked.status_code == 201, chunked.text[:300]


def test_a_key_checked_while_the_database_is_down_is_a_503(tmp_path):
    class Nowhere:  # a PostgreSQL URL on a port nothing listens on
        url = f"postgresql://postgres@127.0.0.1:{free_port()}/none"

    with serving(Nowhere, database_timeout_seconds=1) as port:
        client = Client(port)
        client.request_head("POST", "/v1/messages", post_head(1024 * KIB, "mb_" + "k" * 40))
        answer = client.answer()
    assert answer.status == 503, answer.body
    assert answer.problem()["type"].endswith("/database-unavailable")
    assert answer.headers["retry-after"]


# --- request bodies in flight --------------------------------------------------------------


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_bodies_past_the_in_flight_bound_are_a_503_and_their_bytes_come_back(db):
    _, key = new_tenant(db)
    size = 200 * KIB
    with serving(db, api_body_bytes_in_flight=300 * KIB) as port:
        holder = Client(port)  # declares 200 KiB and sends half: 200 KiB are held
        holder.request_head("POST", "/v1/messages", post_head(size, key))
        holder.send(json_body(size)[: size // 2])
        time.sleep(0.3)  # the server has taken its 200 KiB

        refused = Client(port)  # 200 more would make 400: refused before its body
        refused.request_head("POST", "/v1/messages", post_head(size, key))
        declared = refused.answer()

        chunked = Client(port)  # no length declared: counted as it comes
        head = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        chunked.request_head("POST", "/v1/messages", {**head, "Transfer-Encoding": "chunked"})
        piece = b" " * (32 * KIB)
        for _ in range(4):  # 128 KiB: past the 100 KiB left
            chunked.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        streamed = chunked.answer()

        holder.send(json_body(size)[size // 2 :])
        finished = holder.answer()

        gone = Client(port)  # takes 200 KiB, then its client goes away
        gone.request_head("POST", "/v1/messages", post_head(size, key))
        gone.send(b" " * KIB)
        time.sleep(0.2)
        gone.close()

        later = []  # every held byte was given back: one request may take all 200 KiB again
        deadline = time.monotonic() + 5
        while not later or (later[-1].status == 503 and time.monotonic() < deadline):
            client = Client(port)
            client.request_head("POST", "/v1/messages", post_head(size, key))
            client.send(json_body(size))
            later.append(client.answer())
    assert declared.status == 503
    assert declared.problem()["type"].endswith("/bodies-in-flight")
    assert int(declared.headers["retry-after"]) > 0
    assert declared.headers["connection"] == "close"
    assert streamed.status == 503 and streamed.headers["retry-after"]
    assert finished.status == 201, finished.body[:300]
    assert later[-1].status == 201, later[-1].body[:300]


# --- slow and idle connections -------------------------------------------------------------


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_header_sent_a_line_at_a_time_is_cut_off_after_the_header_timeout(db):
    with serving(db, api_header_timeout_seconds=1) as port:
        client = Client(port)
        started = time.monotonic()
        client.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        with contextlib.suppress(OSError):
            while time.monotonic() - started < 10:  # a header line every 0.2 s, forever
                client.send(b"X-Slow: 1\r\n")
                if client.is_closed(0.2):
                    break
        elapsed = time.monotonic() - started
        answer = client.answer()

        idle = Client(port)  # a connection that never sends a byte
        idle_for = seconds_until_closed(idle)
    assert 0.9 <= elapsed < 4, elapsed
    assert answer.status == 408 and answer.problem()["type"].endswith("/header-too-slow")
    assert 0.9 <= idle_for < 4, idle_for
    assert idle.answer().status == 408


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_header_past_the_size_limit_is_a_431(db):
    with serving(db, api_max_header_bytes=4 * KIB) as port:
        fine = Client(port)
        fine.request_head("GET", "/healthz", {"X-Padding": "p" * (3 * KIB)})
        ok = fine.answer()
        client = Client(port)
        client.send(b"GET /healthz HTTP/1.1\r\nX-Padding: " + b"p" * (8 * KIB))
        answer = client.answer()
        closed = client.is_closed(5)
    assert ok.status == 200
    assert answer.status == 431 and answer.problem()["type"].endswith("/header-too-large")
    assert closed


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_trickled_body_is_a_408_and_a_steady_one_gets_through(db):
    _, key = new_tenant(db)
    size = 4000
    with serving(db, api_body_timeout_seconds=1, api_body_min_bytes_per_second=1000) as port:
        trickle = Client(port)
        trickle.request_head("POST", "/v1/messages", post_head(size, key))
        started = time.monotonic()
        with contextlib.suppress(OSError):
            for byte in json_body(size):  # a byte every 0.2 s
                trickle.send(bytes([byte]))
                if trickle.is_closed(0.2) or time.monotonic() - started > 10:
                    break
        elapsed = time.monotonic() - started
        trickled = trickle.answer()

        stalled = Client(port)  # a tenth of its body, then nothing
        stalled.request_head("POST", "/v1/messages", post_head(size, key))
        stalled.send(json_body(size)[:300])
        paused = stalled.answer()

        # 1000 bytes every 0.35 s: 1.4 s in all, longer than the 1 s timeout, but never
        # idle that long, and faster than 1000 bytes a second.
        steady = Client(port)
        steady.request_head("POST", "/v1/messages", post_head(size, key))
        body = json_body(size)
        for start in range(0, size, 1000):
            time.sleep(0.35)
            steady.send(body[start : start + 1000])
        through = steady.answer()
    assert 0.9 <= elapsed < 4, elapsed
    assert trickled.status == 408
    assert paused.status == 408 and paused.problem()["type"].endswith("/body-too-slow")
    assert paused.headers["connection"] == "close"
    assert through.status == 201, through.body[:300]


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(db):
    with serving(db, api_keep_alive_seconds=1) as port:
        client = Client(port)
        client.request_head("GET", "/healthz")
        answer = client.answer()
        idle_for = seconds_until_closed(client)
    assert answer.status == 200 and "connection" not in answer.headers
    assert 0.9 <= idle_for < 4, idle_for


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_request_beyond_the_connection_limit_is_a_503_until_one_closes(db):
    with serving(db, api_max_connections=3) as port:
        time.sleep(0.3)  # the start-up check's connection is gone
        served = [Client(port) for _ in range(3)]
        for client in served:
            client.request_head("GET", "/healthz")
            assert client.answer().status == 200
        fourth = Client(port)
        fourth.request_head("GET", "/healthz")
        refused = fourth.answer()
        closed = fourth.is_closed(5)
        served.pop().close()
        later: list[Answer] = []
        deadline = time.monotonic() + 5
        while not later or (later[-1].status == 503 and time.monotonic() < deadline):
            client = Client(port)
            client.request_head("GET", "/healthz")
            later.append(client.answer())
            client.close()
    assert refused.status == 503
    assert refused.problem()["type"].endswith("/too-many-connections")
    assert int(refused.headers["retry-after"]) > 0 and closed
    assert later[-1].status == 200


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_mailbag_api_with_worker_processes_applies_the_limits_in_each(db):
    port = free_port()
    env = mailbag_env(db.url, api_header_timeout_seconds="1", api_keep_alive_seconds="1")
    server = start_mailbag("api", "--port", str(port), "--workers", "2", env=env)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/healthz", 60, server)
        idle = [Client(port) for _ in range(6)]  # connections spread over both processes
        kept = Client(port)
        kept.request_head("GET", "/healthz")
        assert kept.answer().status == 200
        idle_for = [seconds_until_closed(client) for client in idle]
        kept_for = seconds_until_closed(kept)
    finally:
        assert stop(server) == 0
    assert all(t < 4 for t in idle_for), idle_for
    assert all(client.answer().status == 408 for client in idle)
    assert kept_for < 4, kept_for
