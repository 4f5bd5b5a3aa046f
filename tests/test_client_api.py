"""mailbag.client against a real `mailbag api` process: every operation, the typed errors,
the retries on a real 503, and a call that outlives its server: the first attempt commits,
its answer is lost, the server is killed and started again, and the retry with the same
Idempotency-Key gets the first answer. Exactly one message."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from api_helpers import new_tenant
from mailbag.client import (
    ActiveVerificationExists,
    Address,
    AsyncClient,
    Attachment,
    AuthenticationFailed,
    BadRequest,
    Client,
    FieldError,
    IdempotencyKeyReused,
    NotCancellable,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    RetryPolicy,
    ValidationError,
    draft,
)
from mailbag.store.schema import idempotency_records, outbox_messages
from servers import free_port, mailbag_env, start_mailbag, stop, wait_until_up
from tcp_proxy import TcpProxy
from verification_helpers import deliver, token_in

from conftest import TestDB
from helpers import tiny_pdf

ADA = {"name": "Ada"}
pytestmark = pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)


@dataclass
class Api:
    """A `mailbag api` process on a port of its own, and a tenant's key for it."""

    db: TestDB
    settings: dict[str, str]
    key: str = ""
    database_url: str | None = None  # else the test database's own
    port: int = field(default_factory=free_port)
    process: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = mailbag_env(self.database_url or self.db.url, **self.settings)
        self.process = start_mailbag("api", "--port", str(self.port), env=env)
        wait_until_up(f"{self.url}/healthz", 60, self.process)

    def kill(self) -> None:
        stop(self.process, signal.SIGKILL)


@contextlib.contextmanager
def serving(db: TestDB, **settings: str) -> Iterator[Api]:
    api = Api(db, settings)
    _, api.key = new_tenant(db)
    api.start()
    try:
        yield api
    finally:
        stop(api.process)


def count(db: TestDB, table: Any = outbox_messages) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def keys_seen(requests: list[httpx.Request]) -> set[str | None]:
    return {r.headers.get("Idempotency-Key") for r in requests}


def fields(error: Any) -> list[str]:
    return [e.field for e in error.errors]


def test_messages_are_sent_read_listed_page_by_page_and_cancelled(db):
    later = datetime.now(UTC) + timedelta(days=1)
    with serving(db) as api, Client(api.url, api.key) as client:
        full = client.messages.send(
            [Address("ada@example.com", "Ada Lovelace"), "charles@example.com"],
            cc="accounts@example.com",
            bcc=["archive@example.com"],
            reply_to=Address("billing@example.com", "Billing"),
            subject="Your invoice",
            html="<p>Attached.</p>",
            attachments=[Attachment("invoice.pdf", tiny_pdf())],
            expires_at=later,
            priority="high",
            tags=["invoice"],
            metadata={"order": 2041},
            headers={"X-Campaign": "autumn"},
        )
        templated = client.messages.send(
            "bob@example.com", template="welcome", data={"name": "Bob"}
        )
        third = client.messages.send(
            "cy@example.com", to_name="Cy", template="welcome", data={"name": "Cy"}
        )
        got = client.messages.get(full.id)
        first_page = client.messages.list(limit=2)
        second_page = client.messages.list(limit=2, cursor=first_page.next_cursor)
        everything = [m.id for m in client.messages.iter(page_size=1)]
        cancelled = client.messages.cancel(templated.id)
        only_cancelled = client.messages.list(status="cancelled")
        with pytest.raises(NotCancellable) as again:
            client.messages.cancel(templated.id)
    assert not full.replayed and full.status == "pending" and full.priority == "high"
    assert [a.address for a in full.recipients.to] == ["ada@example.com", "charles@example.com"]
    assert full.recipients.to[0].name == "Ada Lovelace" and full.reply_to[0].name == "Billing"
    assert [(a.filename, a.content_type, a.size) for a in full.attachments] == [
        ("invoice.pdf", "application/pdf", len(tiny_pdf()))
    ]
    assert full.expires_at is not None and abs(full.expires_at - later) < timedelta(seconds=1)
    assert got.id == full.id and got.events and got.events[0].to_status == "pending"
    assert got.metadata == {"order": 2041} and got.headers == {"X-Campaign": "autumn"}
    assert third.to_name == "Cy"
    assert [m.id for m in first_page.items] == [third.id, templated.id]
    assert [m.id for m in second_page.items] == [full.id] and second_page.next_cursor is None
    assert everything == [third.id, templated.id, full.id]
    assert cancelled.status == "cancelled" and [m.id for m in only_cancelled.items] == [
        templated.id
    ]
    assert again.value.status_now == "cancelled" and again.value.attempts == 1
    assert count(db) == 3


def test_errors_come_back_as_their_own_exceptions_after_a_single_attempt(db):
    requests: list[httpx.Request] = []
    http = httpx.Client(event_hooks={"request": [requests.append]})
    with serving(db, max_attachment_bytes="1000") as api, http:
        client = Client(api.url, api.key, http_client=http)
        with pytest.raises(AuthenticationFailed) as unauthorized:
            Client(api.url, "wrong-key", http_client=http).messages.list()
        with pytest.raises(NotFound) as missing:
            client.messages.get(uuid.uuid4())
        with pytest.raises(ValidationError) as invalid:
            client.messages.send("not an address", template="welcome", data=ADA)
        with pytest.raises(ValidationError) as unknown_template:
            client.messages.send("ada@example.com", template="no-such-template")
        with pytest.raises(ValidationError) as not_an_id:
            client.messages.get("not-a-uuid")
        with pytest.raises(PayloadTooLarge) as too_large:
            client.messages.send(
                "ada@example.com",
                subject="s",
                text="t",
                attachments=[Attachment("big.bin", b"x" * 5000)],
            )
        with pytest.raises(BadRequest) as bad_cursor:
            client.messages.list(cursor="not-a-cursor")
        first = client.messages.send(
            "ada@example.com", template="welcome", data=ADA, idempotency_key="signup-ada"
        )
        same = client.messages.send(
            "ada@example.com", template="welcome", data=ADA, idempotency_key="signup-ada"
        )
        with pytest.raises(IdempotencyKeyReused) as reused:
            client.messages.send(
                "eve@example.com", template="welcome", data=ADA, idempotency_key="signup-ada"
            )
    assert unauthorized.value.status == 401 and unauthorized.value.request_id
    assert missing.value.status == 404 and missing.value.slug == "not-found"
    assert "to" in fields(invalid.value) and "template" in fields(unknown_template.value)
    assert not_an_id.value.slug == "validation-error"
    assert fields(not_an_id.value) == ["message_id"]
    assert too_large.value.slug == "message-too-large"
    assert bad_cursor.value.slug == "invalid-cursor"
    assert same.id == first.id and same.replayed and not first.replayed
    assert reused.value.status == 409 and "different request" in (reused.value.detail or "")
    # One request per call: none of these answers is worth a retry.
    assert len(requests) == 10
    assert count(db) == 1


def test_iter_yields_at_most_limit_messages_a_page_size_per_request(db):
    requests: list[httpx.Request] = []
    http = httpx.Client(event_hooks={"request": [requests.append]})
    with serving(db) as api, Client(api.url, api.key, http_client=http) as client:
        sent = [
            client.messages.send(f"u{i}@example.com", subject="Hi", text="hi") for i in range(5)
        ]
        newest = [m.id for m in reversed(sent)]
        requests.clear()
        three = [m.id for m in client.messages.iter(limit=3, page_size=2)]
        limits = [r.url.params["limit"] for r in requests]
        requests.clear()
        none = list(client.messages.iter(limit=0))
        nothing_asked = len(requests)
        everything = [m.id for m in client.messages.iter(page_size=2)]
        more_than_there_are = [m.id for m in client.messages.iter(limit=50)]
        with pytest.raises(ValueError, match="page_size must be 1 to 100"):
            next(client.messages.iter(page_size=500))
        with pytest.raises(ValueError, match="limit must be 0 or more"):
            next(client.messages.iter(limit=-1))
    http.close()
    assert three == newest[:3]
    assert limits == ["2", "1"]  # the second page asks for only the one still wanted
    assert none == [] and nothing_asked == 0
    assert everything == more_than_there_are == newest


def test_errors_name_their_fields_in_one_shape_whatever_the_kind(db):
    """Domain errors (an invalid address, a message too large; the API sends them as an
    object) and schema errors (a limit out of range, a malformed id; a list) both give
    `errors` as FieldErrors, and the problem body keeps the wire form."""
    big = [Attachment("a.pdf", b"x" * 5000)]
    with serving(db, max_attachment_bytes="1024") as api, Client(api.url, api.key) as client:
        with pytest.raises(ValidationError) as domain:
            client.messages.send("not an address", subject="Hi", text="hi")
        with pytest.raises(PayloadTooLarge) as too_large:
            client.messages.send("ada@example.com", subject="s", text="t", attachments=big)
        with pytest.raises(ValidationError) as query:
            client.messages.list(limit=500)
        with pytest.raises(ValidationError) as path:
            client.messages.get("not-a-uuid")
        batch = client.messages.send_batch([draft("not an address", subject="Hi", text="hi")])
    for raised in (domain.value, too_large.value, query.value, path.value):
        assert raised.errors and all(isinstance(e, FieldError) for e in raised.errors)
        assert all(e.field and e.message for e in raised.errors)
    assert fields(domain.value) == ["to"]
    assert "not a valid email address" in domain.value.errors[0].message
    assert (
        fields(too_large.value) == ["attachments"] and "1024" in too_large.value.errors[0].message
    )
    assert fields(query.value) == ["limit"] and "100" in query.value.errors[0].message
    assert fields(path.value) == ["message_id"]
    assert isinstance(domain.value.problem["errors"], dict)  # as the server sent them
    assert isinstance(query.value.problem["errors"], list)
    (item,) = batch.results
    assert item.error is not None and fields(item.error) == ["to"]


async def test_the_async_client_sends_reads_lists_and_cancels(db):
    async with serving_async(db) as api, AsyncClient(api.url, api.key) as client:
        sent = await asyncio.gather(
            *(
                client.messages.send(
                    f"user{i}@example.com", template="welcome", data={"name": f"U{i}"}
                )
                for i in range(3)
            )
        )
        got = await client.messages.get(sent[0].id)
        listed = [m.id async for m in client.messages.iter(page_size=2)]
        two = [m.id async for m in client.messages.iter(limit=2, page_size=1)]
        cancelled = await client.messages.cancel(sent[1].id)
        with pytest.raises(NotFound):
            await client.messages.cancel(uuid.uuid4())
    assert got.id == sent[0].id and got.data == {"name": "U0"}
    assert sorted(listed) == sorted(m.id for m in sent) and len(listed) == 3
    assert two == listed[:2]
    assert cancelled.status == "cancelled"
    assert count(db) == 3


@contextlib.asynccontextmanager
async def serving_async(db: TestDB, **settings: str) -> Any:
    api = Api(db, settings)
    _, api.key = new_tenant(db)
    await asyncio.to_thread(api.start)
    try:
        yield api
    finally:
        await asyncio.to_thread(stop, api.process)


async def test_a_verification_is_started_read_rate_limited_and_confirmed(db, async_engine):
    settings = {"verification_sends_per_email_per_hour": "1"}
    async with serving_async(db, **settings) as api, AsyncClient(api.url, api.key) as client:
        started = await client.verifications.start("new.user@example.com", data={"product": "Acme"})
        with pytest.raises(ActiveVerificationExists) as active:
            await client.verifications.start("new.user@example.com")
        began = time.monotonic()
        with pytest.raises(RateLimited) as limited:
            await client.verifications.resend(started.id)
        waited = time.monotonic() - began
        token = token_in((await deliver(db, async_engine)).sent[0])
        sent = await client.verifications.get(started.id)
        with pytest.raises(BadRequest) as wrong:
            await client.verifications.confirm(started.id, "not-the-token")
        verified = await client.verifications.confirm(started.id, token)
    assert started.state in ("created", "send_pending") and started.send_count == 1
    assert active.value.active_verification_id == started.id
    # An hour is too long to wait for: raised at once, with how long the server asked for.
    assert limited.value.retry_after is not None and limited.value.retry_after > 60
    assert limited.value.attempts == 1 and waited < 5
    assert sent.state == "sent" and sent.message_id is not None
    assert wrong.value.slug == "invalid-token" and wrong.value.problem["attempts_left"] == 4
    assert verified.state == "verified" and verified.verified_at is not None


class Stall:
    """Makes requests that need the database hang on it, then lets them through: SQLite's
    write lock held by another connection, or PostgreSQL behind a proxy that black-holes
    its bytes (the server must be started after `prepare`)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.stack = contextlib.ExitStack()
        self.holder: sqlite3.Connection | None = None
        self.proxy: TcpProxy | None = None

    def prepare(self) -> None:
        if self.api.db.dialect != "sqlite":
            self.proxy = self.stack.enter_context(TcpProxy.to_database(self.api.db.url))
            self.api.database_url = self.proxy.url(self.api.db.url)

    def begin(self) -> None:
        if self.proxy is not None:
            self.proxy.black_hole()
            return
        path = make_url(self.api.db.url).database
        self.holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.holder.execute("BEGIN IMMEDIATE")

    def end(self) -> None:
        if self.proxy is not None:
            self.proxy.heal()
        elif self.holder is not None:
            self.holder.execute("ROLLBACK")
            self.holder.close()
            self.holder = None

    def close(self) -> None:
        self.end()
        self.stack.close()


def test_a_503_from_a_stalled_database_is_retried_after_its_retry_after(db):
    answers: list[tuple[float, int]] = []
    requests: list[httpx.Request] = []
    api = Api(db, {"database_timeout_seconds": "1"})
    _, api.key = new_tenant(db)
    stall = Stall(api)

    def answered(response: httpx.Response) -> None:
        answers.append((time.monotonic(), response.status_code))
        if response.status_code == 503:
            stall.end()  # the outage ends just after the first 503

    http = httpx.Client(event_hooks={"request": [requests.append], "response": [answered]})
    try:
        stall.prepare()
        api.start()
        stall.begin()
        with http:
            message = Client(api.url, api.key, http_client=http).messages.send(
                "ada@example.com", template="welcome", data={"name": "Ada"}
            )
    finally:
        stall.close()
        if api.process is not None:
            stop(api.process)
    assert [status for _, status in answers] == [503, 201]
    assert answers[1][0] - answers[0][0] >= 5  # the server's Retry-After: 5
    assert len(keys_seen(requests)) == 1 and None not in keys_seen(requests)
    assert count(db) == 1 and message.status == "pending"


class CuttingProxy:
    """A TCP proxy that, once armed, swallows the next answer coming back from the server
    and closes the client's connection: the request was processed, its response is lost.
    From then on it refuses every connection until `reopen()` (the server is down)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.armed = False
        self.refusing = False
        self.cut = threading.Event()
        self.port = 0
        self.server: asyncio.Server | None = None

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    def arm(self) -> None:
        self.armed = True

    def reopen(self) -> None:
        self.refusing = False

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self.server is not None:
            self.server.close()
        others = asyncio.all_tasks() - {asyncio.current_task()}
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.refusing:
            client_w.close()
            return
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            self._pipe(client_r, server_w, answers=False),
            self._pipe(server_r, client_w, answers=True),
            return_exceptions=True,
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: bool
    ) -> None:
        try:
            while data := await reader.read(65536):
                if answers and self.armed:
                    self.armed, self.refusing = False, True
                    self.cut.set()
                    return  # the answer is dropped; closing tells the client nothing more
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()


@contextlib.contextmanager
def lost_answer_then_restart(
    db: TestDB,
) -> Iterator[tuple[Api, CuttingProxy, list[int], threading.Thread]]:
    """A server behind a CuttingProxy, armed. When the answer is cut, a thread checks the
    message was committed, kills the server, starts a new one on the same port, and lets
    connections through again."""
    committed_when_cut: list[int] = []
    with serving(db) as api:
        proxy = CuttingProxy(api.port)
        proxy.start()

        def restart() -> None:
            assert proxy.cut.wait(30)
            committed_when_cut.append(count(db))
            api.kill()
            time.sleep(0.5)  # retries meet a closed door for a while
            api.start()
            proxy.reopen()

        restarter = threading.Thread(target=restart)
        proxy.arm()
        restarter.start()
        try:
            yield api, proxy, committed_when_cut, restarter
        finally:
            restarter.join(60)
            proxy.close()


PATIENT = RetryPolicy(max_attempts=200, max_elapsed=60, backoff=0.1, max_backoff=0.5)


def test_a_send_whose_server_died_before_answering_is_retried_into_exactly_one_message(db):
    requests: list[httpx.Request] = []
    with lost_answer_then_restart(db) as (api, proxy, committed_when_cut, restarter):
        http = httpx.Client(event_hooks={"request": [requests.append]})
        with http:
            client = Client(
                f"http://127.0.0.1:{proxy.port}", api.key, http_client=http, retry=PATIENT
            )
            message = client.messages.send(
                "ada@example.com", template="welcome", data={"name": "Ada"}
            )
        restarter.join(60)
    assert committed_when_cut == [1]  # the first attempt reached the server and committed
    assert message.replayed  # ... and the answer came from the restarted one's record
    assert len(requests) >= 2 and len(keys_seen(requests)) == 1
    assert count(db) == 1 and count(db, idempotency_records) == 1
    with db.engine.connect() as conn:
        assert str(conn.execute(select(outbox_messages.c.id)).scalar_one()) == message.id


async def test_the_async_client_too_makes_exactly_one_message_across_a_restart(db):
    requests: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        requests.append(request)

    with lost_answer_then_restart(db) as (api, proxy, committed_when_cut, restarter):
        async with httpx.AsyncClient(event_hooks={"request": [record]}) as http:
            client = AsyncClient(
                f"http://127.0.0.1:{proxy.port}", api.key, http_client=http, retry=PATIENT
            )
            message = await client.messages.send(
                "ada@example.com", template="welcome", data={"name": "Ada"}
            )
        await asyncio.to_thread(restarter.join, 60)
    assert committed_when_cut == [1] and message.replayed
    assert len(requests) >= 2 and len(keys_seen(requests)) == 1
    assert count(db) == 1
