"""mailbag behind PgBouncer in transaction pooling mode (a real one: tests/pgbouncer/).

Consecutive transactions of one client run on whichever server connection is free, shared
with every other client, and startup `options` are refused. What mailbag sets must follow
the client (the time zone), end with the transaction (the statement bounds), or not exist
(prepared statements). The worker processes run through it in test_worker_processes.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from api_helpers import api_client, new_tenant
from mailbag import runtime
from mailbag.settings import Settings
from mailbag.store.database import make_async_engine, make_engine
from mailbag.store.listen import libpq_url

from conftest import TestDB as ScratchDB

pytestmark = pytest.mark.parametrize("db", ["postgresql"], indirect=True)

BOUND = 1.0  # seconds: the statement bound in these tests
BODY = {"to": "ada@example.com", "template": "welcome", "data": {"name": "Ada"}}


@pytest.fixture
def bounced(pgbouncer_url: str) -> Iterator[Engine]:
    """A bounded engine as the API and worker make them, through PgBouncer."""
    engine = make_engine(pgbouncer_url, pool_size=2, statement_timeout=BOUND)
    yield engine
    engine.dispose()


def raw(url: str, *, prepare: bool = False) -> psycopg.Connection[Any]:
    """Another client, outside mailbag. Not preparing, unless asked: the names it would
    prepare stay on the pool's server connections, colliding with the next such client."""
    threshold = 5 if prepare else None
    return psycopg.connect(libpq_url(url), autocommit=True, prepare_threshold=threshold)


def test_the_startup_options_pgbouncer_refuses_are_gone(db: ScratchDB, bounced: Engine) -> None:
    """What mailbag used to send fails at connect; what it sends now connects, in UTC."""
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter: options"):
        psycopg.connect(libpq_url(str(bounced.url)), options="-c timezone=UTC")
    with bounced.connect() as conn:
        zone = conn.execute(text("SELECT current_setting('TimeZone')")).scalar_one()
        stored = conn.execute(text("SELECT now()")).scalar_one()
    assert zone == "UTC" and stored.utcoffset().total_seconds() == 0


def test_the_time_zone_follows_the_client_onto_every_server_connection(
    db: ScratchDB, bounced: Engine, pgbouncer_url: str
) -> None:
    with raw(pgbouncer_url) as other:  # another client, in another zone, on the same pool
        other.execute("SET TIME ZONE 'America/Lima'")
        for _ in range(20):
            with bounced.begin() as conn:
                assert conn.execute(text("SHOW TimeZone")).scalar_one() == "UTC"
            assert other.execute("SHOW TimeZone").fetchone() == ("America/Lima",)


def test_the_statement_bounds_hold_and_never_reach_another_client(
    db: ScratchDB, bounced: Engine, pgbouncer_url: str
) -> None:
    ours, theirs = set(), set()
    for _ in range(10):
        with bounced.begin() as conn:
            ours.add(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
    with raw(pgbouncer_url) as other:
        for _ in range(10):
            pid, bound, idle = other.execute(
                "SELECT pg_backend_pid(), current_setting('statement_timeout'),"
                " current_setting('idle_in_transaction_session_timeout')"
            ).fetchone()  # type: ignore[misc]
            theirs.add(pid)
            assert (bound, idle) == ("0", "0")
    assert ours & theirs, "the two clients never shared a server connection: no proof"
    # The test can fail: a session-level SET, what per transaction avoids, does leak.
    with bounced.begin() as conn:
        conn.execute(text("SET statement_timeout = 4321"))
    with raw(pgbouncer_url) as other:
        leaked = {other.execute("SHOW statement_timeout").fetchone()[0] for _ in range(10)}  # type: ignore[index]
    with bounced.begin() as conn:
        conn.execute(text("RESET statement_timeout"))
    assert "4321ms" in leaked


def test_the_server_ends_a_long_statement_and_an_idle_transaction(
    db: ScratchDB, bounced: Engine
) -> None:
    started = time.monotonic()
    with pytest.raises(OperationalError, match="statement timeout"), bounced.connect() as conn:
        conn.execute(text("SELECT pg_sleep(3)"))
    assert time.monotonic() - started < BOUND + 1
    with pytest.raises(DBAPIError, match="idle-in-transaction"), bounced.begin() as conn:
        conn.execute(text("SELECT 1"))
        time.sleep(BOUND + 1)  # a client that stops mid-transaction holding its locks
        conn.execute(text("SELECT 1"))
    with bounced.connect() as conn:  # the pool recovers
        assert conn.execute(text("SELECT 1")).scalar_one() == 1


async def test_a_pipelined_transaction_has_the_bounds_every_other_one_has(
    db: ScratchDB, pgbouncer_url: str
) -> None:
    """store/pipeline.py sends BEGIN itself, outside SQLAlchemy's begin event: the bounds go
    with it, in the same round trip, and end with the transaction."""
    from mailbag.store.plan import Step, together
    from mailbag.store.session import AsyncDatabase

    engine = make_async_engine(pgbouncer_url, pool_size=1, statement_timeout=BOUND)
    setting = text(
        "SELECT current_setting('statement_timeout'),"
        " current_setting('idle_in_transaction_session_timeout')"
    )

    def plan() -> Any:
        first, second = yield from together(Step(setting), Step(setting), last=True)
        return first.one(), second.one()

    try:
        inside = await AsyncDatabase(engine).run_at_once(plan())
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            after = (await conn.execute(setting)).one()
    finally:
        await engine.dispose()
    assert inside == (("1s", "1s"), ("1s", "1s"))
    assert tuple(after) == ("0", "0")  # SET LOCAL: gone with the transaction


async def test_repeated_statements_on_shared_server_connections_never_collide(
    db: ScratchDB, pgbouncer_url: str
) -> None:
    engine = make_async_engine(pgbouncer_url, pool_size=6, statement_timeout=5)

    async def client(n: int) -> None:
        for i in range(30):  # far past psycopg's threshold (5) for preparing a statement
            async with engine.begin() as conn:
                query = "SELECT :n + :i" if n % 2 else "SELECT :i * :n"
                assert (await conn.execute(text(query), {"n": n, "i": i})).scalar_one() >= 0

    try:
        await asyncio.gather(*(client(n) for n in range(6)))
    finally:
        await engine.dispose()
    # The test can fail: with psycopg's prepared statements, two clients meet on a server.
    with (
        raw(pgbouncer_url, prepare=True) as one,
        raw(pgbouncer_url, prepare=True) as two,
        pytest.raises(psycopg.errors.DuplicatePreparedStatement),
    ):
        for _ in range(10):
            one.execute("SELECT 1", prepare=True)
            two.execute("SELECT 2", prepare=True)


async def test_the_api_serves_through_pgbouncer(db: ScratchDB, pgbouncer_url: str) -> None:
    _, key = new_tenant(db)
    async with api_client(db, key, database_url=pgbouncer_url) as api:
        ids = []
        for i in range(12):  # past psycopg's threshold for preparing the same statements
            created = await api.post(
                "/v1/messages", json=BODY, headers={"Idempotency-Key": f"k-{i}"}
            )
            assert created.status_code == 201, created.text
            ids.append(created.json()["id"])
        again = await api.post("/v1/messages", json=BODY, headers={"Idempotency-Key": "k-0"})
        assert again.status_code == 201 and again.json()["id"] == ids[0]  # the replay
        listed = await api.get("/v1/messages", params={"limit": 50})
        assert listed.status_code == 200 and len(listed.json()["items"]) == 12


def test_migrations_run_on_migrate_url_and_the_rest_on_database_url(
    db: ScratchDB, pgbouncer_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    used: list[str] = []
    real = runtime.make_engine

    def recording(url: str, **options: Any) -> Engine:
        used.append(url)
        return real(url, **options)

    monkeypatch.setattr(runtime, "make_engine", recording)
    settings = Settings(database_url=pgbouncer_url, migrate_url=db.url)
    runtime.ensure_schema(settings, upgrade=True)
    runtime.ensure_schema(settings, upgrade=False)
    assert used == [db.url, pgbouncer_url]


def test_a_direct_url_s_own_server_settings_still_win(db: ScratchDB) -> None:
    """`?options=-c ...` (direct connections only) overrides what mailbag would set."""
    url = make_url(db.url).update_query_dict({"options": "-c statement_timeout=0 -c TimeZone=UTC"})
    engine = make_engine(url, null_pool=True, statement_timeout=BOUND)
    try:
        with engine.begin() as conn:
            settings = conn.execute(
                text(
                    "SELECT current_setting('statement_timeout'),"
                    " current_setting('idle_in_transaction_session_timeout')"
                )
            ).one()
    finally:
        engine.dispose()
    assert tuple(settings) == ("0", "1s")  # the URL's bound kept; the other one mailbag's


async def test_prepared_statements_are_off_unless_a_direct_url_turns_them_on(
    db: ScratchDB,
) -> None:
    """Off by default (safe behind any pooler); `?prepare_threshold=5` for a direct
    connection, or PgBouncer >= 1.21 with max_prepared_statements (docs/pgbouncer.md)."""
    thresholds = []
    for url in (db.url, make_url(db.url).update_query_dict({"prepare_threshold": "5"})):
        engine = make_async_engine(url, pool_size=1, statement_timeout=5)
        try:
            async with engine.connect() as conn:
                raw_connection = await conn.get_raw_connection()
                thresholds.append(raw_connection.driver_connection.prepare_threshold)  # type: ignore[union-attr]
        finally:
            await engine.dispose()
    assert thresholds == [None, 5]
