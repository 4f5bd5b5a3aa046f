"""A TCP proxy that can black-hole traffic: a network partition as the application sees it.

`black_hole()` stops forwarding in both directions while every connection stays open and
the kernel keeps accepting bytes: nothing is refused, reset or closed, nothing answers
(so TCP keepalives and `tcp_user_timeout` cannot tell; only the application's own clock
can). `heal()` forwards what was held back and carries on, as TCP does after a partition.
`lose_commit_answer(after=marker)` partitions only the answers, at one chosen moment: the
COMMIT that follows an answer carrying `marker` reaches the server, its answer does not.
The proxy runs its own event loop in a thread, so the code under test cannot stall it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from sqlalchemy.engine import make_url


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.flowing = asyncio.Event()  # client -> server
        self.answering = asyncio.Event()  # server -> client
        self.trap: bytes | None = None  # see lose_commit_answer
        self.sprung = threading.Event()
        self.connections: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None
        self.port = 0

    @classmethod
    @contextlib.contextmanager
    def to_database(cls, url: str) -> Iterator[TcpProxy]:
        """A proxy in front of the server `url` names."""
        parsed = make_url(url)
        default_port = 5432 if parsed.drivername.startswith("postgres") else 3306
        proxy = cls(parsed.host or "127.0.0.1", parsed.port or default_port)
        proxy.start()
        try:
            yield proxy
        finally:
            proxy.close()

    def url(self, url: str) -> str:
        """`url` with its host and port pointing at this proxy."""
        return make_url(url).set(host="127.0.0.1", port=self.port).render_as_string(False)

    def start(self) -> None:
        self.thread.start()
        self._call(self._start())

    def black_hole(self) -> None:
        self._call(self._set(False))

    def lose_commit_answer(self, *, after: bytes) -> None:
        """On the connection that next receives `after`, let the client's next COMMIT through
        and then answer nobody (the answers are held until `heal`): a transaction committed
        whose client never hears it. `sprung` is set at that moment."""
        self.trap = after

    def heal(self) -> None:
        self._call(self._set(True))

    def close(self) -> None:
        self._call(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    async def _set(self, flowing: bool) -> None:
        for direction in (self.flowing, self.answering):
            if flowing:
                direction.set()
            else:
                direction.clear()

    async def _start(self) -> None:
        await self._set(True)
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.connections):
            writer.close()
        others = asyncio.all_tasks() - {asyncio.current_task()}
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self.connections |= {client_w, server_w}
        marked: list[bool] = []  # this connection has received the trap's marker
        await asyncio.gather(
            self._pipe(client_r, server_w, self.flowing, requests_of=marked),
            self._pipe(server_r, client_w, self.answering, answers_of=marked),
            return_exceptions=True,
        )
        self.connections -= {client_w, server_w}

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: asyncio.Event,
        *,
        requests_of: list[bool] | None = None,
        answers_of: list[bool] | None = None,
    ) -> None:
        try:
            while True:
                await direction.wait()
                data = await reader.read(65536)
                if not data:
                    break
                await direction.wait()  # read just before the partition: held back
                if answers_of is not None and self.trap is not None and self.trap in data:
                    answers_of.append(True)
                if requests_of and self.trap is not None and b"COMMIT" in data.upper():
                    self.trap = None
                    self.answering.clear()  # before the COMMIT leaves: its answer is held
                    self.sprung.set()
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()
