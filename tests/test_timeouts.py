"""A database behind a network that swallows everything: fail fast, then recover.

The API and a worker talk to PostgreSQL or MariaDB through a proxy that can black-hole
traffic (tests/tcp_proxy.py): connections stay open and nothing answers, the partition
that used to hang requests for 40 s and one pooled request for 15 minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from api_helpers import api_client, new_tenant, settings_for
from mailbag import runtime
from mailbag.settings import Settings
from mailbag.store.database import DatabaseTimeout, connect_args, make_async_engine, within
from mailbag.templates import builtin
from mailbag.worker import Worker, WorkerConfig
from tcp_proxy import TcpProxy
from test_worker import FAST_RETRY, enqueue

from conftest import TestDB
from helpers import status_counts
from memory_provider import MemoryProvider

TIMEOUT = 2.0  # DATABASE_TIMEOUT_SECONDS in these tests (5 by default)
SLACK = 1.5  # what an answer may take beyond it on a busy two-core test machine
BODY = {"to": "ada@example.com", "template": "welcome", "data": {"name": "Ada"}}

servers = pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)


async def timed(request: Any) -> tuple[Any, float]:
    started = time.monotonic()
    answer = await request
    return answer, time.monotonic() - started


@servers
async def test_the_api_answers_503_within_its_timeout_during_a_partition_then_recovers(db):
    _, key = new_tenant(db)
    with TcpProxy.to_database(db.url) as proxy:
        async with api_client(
            db, key, database_url=proxy.url(db.url), database_timeout_seconds=TIMEOUT
        ) as api:
            # Pooled connections exist, and the key is known: what hung for 15 minutes.
            assert (await api.post("/v1/messages", json=BODY)).status_code == 201
            proxy.black_hole()
            answers = await asyncio.gather(
                timed(api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "k-1"})),
                timed(api.get("/v1/messages")),
                timed(api.get("/readyz")),
                # A new connection (the pool's are all taken) meets the partition at connect.
                *(timed(api.get("/v1/messages")) for _ in range(25)),
            )
            for answer, seconds in answers:
                assert answer.status_code == 503, answer.text
                assert answer.headers["Retry-After"] == "5"
                assert seconds < TIMEOUT + SLACK
            assert answers[0][0].json()["type"].endswith("/database-unavailable")
            # The process's own metrics still come out, without the database's gauges.
            metrics, seconds = await timed(api.get("/metrics"))
            assert metrics.status_code == 200 and "mailbag_" in metrics.text
            assert seconds < TIMEOUT + SLACK

            proxy.heal()
            again = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "k-1"})
            assert again.status_code == 201
            listed = await api.get("/v1/messages")
            assert listed.status_code == 200 and len(listed.json()["items"]) == 2
            assert (await api.get("/readyz")).status_code == 200


@contextlib.asynccontextmanager
async def worker_behind(proxy: TcpProxy, db: TestDB, provider: Any) -> AsyncIterator[Any]:
    """A worker as `mailbag worker` builds it, on a database behind the proxy; running."""
    settings = settings_for(db, database_url=proxy.url(db.url), database_timeout_seconds=TIMEOUT)
    engine = runtime.worker_engine(settings)
    config = WorkerConfig.from_settings(
        settings, poll_interval=0.05, sweep_every=0.05, policy=FAST_RETRY, db_backoff=(0.2, 0.5)
    )
    worker = Worker(engine=engine, provider=provider, catalog=builtin(), config=config)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield worker, task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await engine.dispose()


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_a_slow_upload_is_not_a_database_timeout(db):
    _, key = new_tenant(db)
    body = json.dumps(BODY).encode()

    async def slowly() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 10):  # over a second in all
            await asyncio.sleep(0.2)
            yield body[i : i + 10]

    async with api_client(db, key, database_timeout_seconds=1) as api:
        created = await api.post(
            "/v1/messages", content=slowly(), headers={"Content-Type": "application/json"}
        )
    assert created.status_code == 201, created.text


@servers
async def test_a_worker_notices_a_partition_within_its_timeout_and_delivers_after(db):
    provider = MemoryProvider()
    with TcpProxy.to_database(db.url) as proxy:
        async with worker_behind(proxy, db, provider) as (worker, task):
            enqueue(db, 1)
            await wait_for(lambda: status_counts(db) == {"sent": 1}, "the first email")
            proxy.black_hole()
            started = time.monotonic()
            await wait_for(lambda: worker.db_backoff.failures > 0, "the worker to notice")
            assert time.monotonic() - started < TIMEOUT + SLACK
            enqueue(db, 3)  # straight to the database, not through the partition
            await asyncio.sleep(TIMEOUT)  # a few more rounds in the dark: nothing hangs
            assert not task.done() and len(provider.sent) == 1
            proxy.heal()
            await wait_for(lambda: status_counts(db) == {"sent": 4}, "delivery after healing")
    assert len(provider.sent) == 4


@servers
async def test_an_outcome_written_during_a_partition_is_kept_and_written_after(db):
    provider = MemoryProvider()
    provider.gate = asyncio.Event()
    with TcpProxy.to_database(db.url) as proxy:
        async with worker_behind(proxy, db, provider):
            enqueue(db, 2)
            # At the provider, not only claimed in the database: a claim whose COMMIT
            # answer the partition swallowed is one the worker never knew it made.
            await wait_for(lambda: provider.in_flight == 2, "two sends in flight")
            assert status_counts(db) == {"processing": 2}
            proxy.black_hole()
            provider.gate.set()  # the sends finish into the partition
            await wait_for(lambda: len(provider.sent) == 2, "the sends")
            await asyncio.sleep(TIMEOUT + 0.5)  # the finalize times out, at least once
            assert status_counts(db) == {"processing": 2}
            proxy.heal()
            await wait_for(lambda: status_counts(db) == {"sent": 2}, "the outcomes written")
    assert len(provider.sent) == 2


@servers
async def test_a_claim_committed_while_its_answer_is_lost_is_released_and_sent_once(db):
    provider = MemoryProvider()
    with TcpProxy.to_database(db.url) as proxy:
        async with worker_behind(proxy, db, provider) as (worker, _):
            # The first claim to take the message commits; the worker never hears so.
            proxy.lose_commit_answer(after=b"user0@example.com")
            enqueue(db, 1)  # straight to the database, not through the proxy
            await wait_for(proxy.sprung.is_set, "the claim's COMMIT")
            await wait_for(lambda: worker.db_backoff.failures > 0, "the worker to give up")
            assert status_counts(db) == {"processing": 1} and provider.sent == []
            proxy.heal()
            await wait_for(lambda: status_counts(db) == {"sent": 1}, "the release, then the send")
            assert worker.report.stats["released_unconfirmed"] == 1
    assert len(provider.sent) == 1


@servers
async def test_the_server_ends_a_statement_that_outlives_the_timeout(db):
    """The backstop for work a client gave up on: it must not run on, holding locks."""
    engine = runtime.worker_engine(settings_for(db, database_timeout_seconds=1))
    sleep = "SELECT pg_sleep(3)" if db.dialect == "postgresql" else "SELECT SLEEP(3)"
    started = time.monotonic()
    with pytest.raises(OperationalError, match=r"statement timeout|max_statement_time"):
        async with engine.connect() as conn:
            await conn.execute(text(sleep))
    assert time.monotonic() - started < 2.5
    await engine.dispose()


def test_a_url_s_own_connection_parameters_win():
    args = connect_args(
        "postgresql://u@db.example/mailbag?connect_timeout=30&options=-c%20statement_timeout%3D0",
        5,
        statement_timeout=5,
    )
    assert "connect_timeout" not in args and args["tcp_user_timeout"] == 5000
    assert args["options"].endswith("-c statement_timeout=0")  # last: it wins
    assert "connect_timeout" not in connect_args("mysql://u@db.example/m?connect_timeout=9", 5)


async def test_within_gives_up_on_time_without_waiting_for_the_work_to_wind_down():
    stubborn_exit = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(60)
        finally:  # like psycopg asking the server to cancel, across a partition
            await asyncio.shield(stubborn_exit.wait())

    started = time.monotonic()
    with pytest.raises(DatabaseTimeout):
        await within(0.1, work())
    assert time.monotonic() - started < 1
    stubborn_exit.set()
    assert await within(1, asyncio.sleep(0, "done")) == "done"


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_readiness_with_a_database_that_refuses_says_when_to_retry(db):
    async with api_client(db) as api:
        services = api._transport.app.state.services  # type: ignore[attr-defined]
        services.engine = make_async_engine("postgresql://nobody@127.0.0.1:1/none")
        down = await api.get("/readyz")
        await services.engine.dispose()
    assert down.status_code == 503 and down.headers["Retry-After"] == "5"


def test_the_database_timeout_defaults_to_five_seconds():
    assert Settings().database_timeout_seconds == 5.0


async def wait_for(condition: Any, what: str, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)
