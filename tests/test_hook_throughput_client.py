"""The deliverer's HTTP client (worker/hook_http.py HookClient) against receivers that say
exactly what a test scripts: connections kept and reused, and never when an answer was too
long, broke off, or the receiver spoke out of turn; what each failure is called."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from mailbag.domain.hooks.urls import Policy, check
from mailbag.worker import hook_http

LOCAL = Policy(allow_loopback=True)
NO_CONTENT = b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"
HEADERS = {"content-type": "application/json", "webhook-id": "msg_1"}

Answer = Callable[[int, bytes], bytes | None]  # (request number, request) -> bytes to send


class Scripted:
    """A receiver on 127.0.0.1 answering each request with what `answer` returns (None:
    close the connection instead); counts connections and requests."""

    def __init__(self, answer: Answer) -> None:
        self.answer, self.connections, self.requests = answer, 0, 0
        self.close_after_answer = False
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                self.requests += 1
                answer = self.answer(self.requests, head + body)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after_answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def receiver(answer: Answer) -> AsyncIterator[tuple[Scripted, str]]:
    scripted = Scripted(answer)
    server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield scripted, f"http://127.0.0.1:{port}/hooks?k=v"
    finally:
        server.close()
        for writer in scripted.writers:
            writer.close()


@asynccontextmanager
async def client(**options: Any) -> AsyncIterator[hook_http.HookClient]:
    found = hook_http.HookClient(hook_http.Guard(LOCAL), connections=8, **options)
    try:
        yield found
    finally:
        await found.aclose()


async def post(poster: hook_http.HookClient, url: str, body: bytes = b"{}") -> int:
    async with asyncio.timeout(5):
        return await poster.post(check(url, LOCAL), body, HEADERS)


async def test_posts_to_one_receiver_share_one_kept_connection():
    seen: list[bytes] = []

    def answer(n: int, request: bytes) -> bytes:
        seen.append(request)
        return NO_CONTENT

    async with receiver(answer) as (scripted, url), client() as poster:
        assert [await post(poster, url, b'{"n":%d}' % i) for i in range(5)] == [204] * 5
    assert (scripted.connections, scripted.requests) == (1, 5)
    head = seen[0].split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"post /hooks?k=v http/1.1\r\n")
    assert b"\r\nhost: 127.0.0.1:" in head and b"\r\ncontent-length: 7" in head
    assert b"\r\nwebhook-id: msg_1" in head and seen[0].endswith(b'{"n":0}')


@pytest.mark.parametrize(
    ("answer", "kept"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", True),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", True),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + NO_CONTENT, True),
        # Longer than a connection is worth reading for: closed, the answer still counts.
        (b"HTTP/1.1 200 OK\r\ncontent-length: 999999\r\n\r\n" + b"x" * 1000, False),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            + (b"4000\r\n" + b"x" * 0x4000 + b"\r\n") * 2,
            False,
        ),
        (b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n", False),
    ],
    ids=["length", "chunked", "continue", "too-long", "too-long-chunked", "close"],
)
async def test_a_connection_is_kept_only_after_an_answer_read_to_its_end(answer, kept):
    async with receiver(lambda n, request: answer) as (scripted, url), client() as poster:
        status = await post(poster, url)
        await post(poster, url)
    assert status == int(answer.rsplit(b"HTTP/1.1 ", 1)[1][:3])
    assert scripted.connections == (1 if kept else 2)


async def test_an_answer_whose_end_is_the_connections_is_an_answer():
    async with receiver(lambda n, r: b"HTTP/1.0 200 OK\r\n\r\nbye") as (scripted, url):
        scripted.close_after_answer = True  # h11 reads the body to the connection's end
        async with client() as poster:
            assert await post(poster, url) == 200
            assert await post(poster, url) == 200
    assert scripted.connections == 2


async def test_a_kept_connection_the_receiver_closed_meanwhile_is_not_used_again():
    async with receiver(lambda n, r: NO_CONTENT) as (scripted, url), client() as poster:
        assert await post(poster, url) == 204
        scripted.writers[0].close()  # the receiver's idle timeout
        await asyncio.sleep(0.05)
        assert await post(poster, url) == 204
    assert scripted.connections == 2


async def test_a_kept_connection_that_speaks_out_of_turn_is_dropped():
    async with receiver(lambda n, r: NO_CONTENT) as (scripted, url), client() as poster:
        assert await post(poster, url) == 204
        scripted.writers[0].write(NO_CONTENT)  # an answer nobody asked for
        await asyncio.sleep(0.05)
        assert await post(poster, url) == 204  # not taken for the next one's answer
    assert scripted.connections == 2


async def test_a_kept_connection_idle_too_long_is_closed_not_used():
    async with receiver(lambda n, r: NO_CONTENT) as (scripted, url), client(keepalive=0.05) as c:
        await post(c, url)
        await asyncio.sleep(0.1)
        await post(c, url)
    assert scripted.connections == 2


@pytest.mark.parametrize(
    ("answer", "failure"),
    [
        (lambda n, r: None, "network: the HTTP exchange failed"),  # closed, no answer
        (lambda n, r: b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "network: the HTTP exchange failed"),
        (lambda n, r: b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", "timeout"),
    ],
    ids=["closed", "not-http", "short-body"],
)
async def test_an_exchange_that_breaks_off_is_a_network_failure_never_the_receivers_words(
    answer, failure
):
    async with receiver(answer) as (_, url), client() as poster:
        with pytest.raises(Exception) as raised:  # what it is, is the test
            async with asyncio.timeout(0.5):
                await poster.post(check(url, LOCAL), b"{}", HEADERS)
    if failure == "timeout":
        assert isinstance(raised.value, TimeoutError)
        return
    assert isinstance(raised.value, hook_http.POST_ERRORS)
    assert str(hook_http.failure_of(raised.value)) == failure
    assert "SSH" not in str(hook_http.failure_of(raised.value))


async def test_a_refused_connection_is_refused():
    async with receiver(lambda n, r: NO_CONTENT) as (_, url):
        pass  # closed again: nothing listens there now
    async with client() as poster:
        with pytest.raises(hook_http.ConnectFailed) as raised:
            await post(poster, url)
    assert str(hook_http.failure_of(raised.value)) == "refused: connection refused"
