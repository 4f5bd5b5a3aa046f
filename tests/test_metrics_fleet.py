"""Metrics past one process: `mailbag api --workers N` reports the counters of all its
processes, and a /metrics scrape costs a bounded, cached amount of database work however
large the outbox grows (it was a full count by status and ~19 statements per scrape)."""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import pytest
from prometheus_client import Gauge
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Connection, event, insert, text

from api_helpers import api_client, new_tenant
from mailbag import metrics
from mailbag.api.scrape import OutboxGaugeCache
from mailbag.cli.run import shared_metrics
from mailbag.clock import utcnow
from mailbag.domain.states import Status
from mailbag.store import stats
from mailbag.store.database import make_async_engine
from mailbag.store.plan import answering, dialect_of_connection
from mailbag.store.schema import outbox_messages as om
from mailbag.store.schema import provider_events as pe
from servers import free_port, mailbag_env, start_mailbag, stop, wait_until_up

from conftest import TestDB

# The statements one read of the outbox's gauges makes: the capped counts, then the two
# index ranges that find the oldest due message.
STATEMENTS_PER_READ = 3
# ... and of the fleet's state (pauses and breakers: tables of a few rows), for the pause gauges,
# and the count of sender domains that are not ready.
FLEET_STATE_READS = 3
SESSION_STATEMENTS = 2
START_TIMEOUT = 120  # a bound on a loaded machine, not a speed requirement
BODY = {"to": "ada@example.com", "template": "welcome", "data": {"name": "Ada"}}


def outbox_rows(
    statuses: dict[Status, int], *, due_ago: timedelta = timedelta(0)
) -> list[dict[str, Any]]:
    """Bare outbox rows in these states, written directly (thousands in a blink)."""
    now = utcnow()
    rows = []
    for status, n in statuses.items():
        for _ in range(n):
            rows.append(
                {
                    "id": uuid4(),
                    "tenant_id": "default",
                    "to_address": "someone@example.com",
                    "template_name": "welcome",
                    "template_data": {},
                    "headers": {},
                    "tags": [],
                    "metadata": {},
                    "status": status.value,
                    "attempt_count": 0,
                    "max_attempts": 5,
                    "next_attempt_at": now - due_ago,
                    "claim_order_at": now - due_ago,
                    "created_at": now - due_ago,
                    "updated_at": now - due_ago,
                }
            )
    return rows


def fill(db: TestDB, statuses: dict[Status, int], **options: Any) -> None:
    rows = outbox_rows(statuses, **options)
    with db.engine.begin() as conn:
        for start in range(0, len(rows), 1000):
            conn.execute(insert(om), rows[start : start + 1000])


def unmatched_events(db: TestDB, n: int) -> None:
    now = utcnow()
    with db.engine.begin() as conn:
        conn.execute(
            insert(pe),
            [
                {
                    "provider": "ses",
                    "dedup_key": f"unmatched-{i}",
                    "kind": "bounce",
                    "provider_event": "Bounce",
                    "occurred_at": now,
                    "received_at": now,
                    "raw": {},
                }
                for i in range(n)
            ],
        )


class StatementCounter:
    """Every statement an engine sends, counted where the driver gets it."""

    def __init__(self, engine: Any) -> None:
        self.statements: list[str] = []
        self.engine = engine
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements.append(statement)

    def take(self) -> list[str]:
        seen, self.statements = self.statements, []
        return seen

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)


def table_reads(statements: list[str]) -> list[str]:
    return [s for s in statements if re.search(r"\bFROM\b", s, re.IGNORECASE)]


def gauge_values(text_body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text_body)
        for s in family.samples
    }


# --- the database work of a scrape --------------------------------------------------------------


async def test_a_scrape_reads_the_outbox_in_a_few_statements_at_most_once_per_window(db):
    fill(db, {Status.PENDING: 30, Status.UNKNOWN: 2, Status.SENT: 50}, due_ago=timedelta(minutes=3))
    unmatched_events(db, 4)
    async with api_client(db) as api:
        app = api._transport.app  # type: ignore[attr-defined]
        assert app.state.outbox_gauges.seconds == 15.0  # METRICS_CACHE_SECONDS' default
        clock = [1000.0]
        app.state.outbox_gauges = OutboxGaugeCache(15.0, monotonic=lambda: clock[0])
        counter = StatementCounter(app.state.services.engine.sync_engine)
        try:
            first = await api.get("/metrics")
            read = counter.take()
            again = await api.get("/metrics")  # within the window: no database work at all
            cached = counter.take()
            fill(db, {Status.PENDING: 300, Status.SENT: 1000})  # the outbox grows ...
            clock[0] += 15.0
            later = await api.get("/metrics")
            reread = counter.take()  # ... and the next read costs the same statements
        finally:
            counter.close()
    assert first.status_code == again.status_code == later.status_code == 200
    assert len(table_reads(read)) == STATEMENTS_PER_READ + FLEET_STATE_READS, read
    # Besides: what the session needs (SQLite's BEGIN, a per-transaction setting).
    assert len(read) <= STATEMENTS_PER_READ + FLEET_STATE_READS + SESSION_STATEMENTS, read
    assert cached == []
    assert len(reread) == len(read), reread
    assert not any(re.search(r"GROUP BY", s, re.IGNORECASE) for s in read + reread)
    values = gauge_values(first.text)
    assert values[("mailbag_messages", (("state", "pending"),))] == 30
    assert values[("mailbag_messages", (("state", "unknown"),))] == 2
    assert ("mailbag_messages", (("state", "sent"),)) not in values  # the counters' job
    assert values[("mailbag_unmatched_provider_events_stored", ())] == 4
    assert 170 <= values[("mailbag_oldest_due_message_age_seconds", ())] < 300
    assert gauge_values(again.text)[("mailbag_messages", (("state", "pending"),))] == 30
    assert gauge_values(later.text)[("mailbag_messages", (("state", "pending"),))] == 330
    read_at = gauge_values(later.text)[("mailbag_outbox_gauges_read_timestamp_seconds", ())]
    assert abs(read_at - utcnow().timestamp()) < 60


def test_counts_stop_at_their_cap(db):
    fill(db, {Status.PENDING: 25, Status.RETRYING: 3})
    unmatched_events(db, 12)
    with db.engine.connect() as conn:
        gauges = run_plan(conn, stats.outbox_gauges(utcnow(), cap=10))
    assert gauges.counts == {"pending": 10, "processing": 0, "retrying": 3, "unknown": 0}
    assert gauges.unmatched_provider_events == 10


@pytest.mark.parametrize("db", ["sqlite", "postgresql", "mysql"], indirect=True)
def test_every_statement_of_a_read_goes_through_an_index(db):
    # Mostly finished rows and a backlog, as an outbox is; the optimizers choose by the mix.
    fill(db, {Status.SENT: 4000, Status.PENDING: 100}, due_ago=timedelta(days=1))
    fill(db, {Status.PENDING: 100, Status.RETRYING: 20, Status.UNKNOWN: 2})
    if db.dialect != "sqlite":
        with db.engine.begin() as conn:  # statistics, as autovacuum / InnoDB keep them
            conn.execute(
                text(
                    "ANALYZE outbox_messages"
                    if db.dialect == "postgresql"
                    else "ANALYZE TABLE outbox_messages"
                )
            )
    unmatched_events(db, 3)
    with db.engine.connect() as conn:
        plans = explained(conn, stats.outbox_gauges(utcnow()))
    assert len(plans) == STATEMENTS_PER_READ
    for plan in plans:
        full_scans = [
            line
            for line in plan
            if re.search(r"(outbox_messages|provider_events)", line) and is_full_scan(db, line)
        ]
        assert not full_scans, "\n".join(plan)


def run_plan(conn: Connection, plan: Any) -> Any:
    return explained(conn, plan, explain=False)


def explained(conn: Connection, plan: Any, *, explain: bool = True) -> Any:
    """Run a plan on `conn`; each statement's query plan (lines) first, or the answer."""
    dialect = dialect_of_connection(conn)
    if dialect == "postgresql":
        # Tiny tables favour a sequential scan; forbidden, the planner still picks one
        # only when no index can serve the statement.
        conn.execute(text("SET enable_seqscan = off"))
    plans = []
    steps = answering(plan, dialect)
    try:
        step = next(steps)
        while True:
            if explain:
                plans.append(query_plan(conn, step.statement))
            step = steps.send(conn.execute(step.statement, step.params))
    except StopIteration as done:
        answer = done.value
    if dialect == "postgresql":
        conn.execute(text("RESET enable_seqscan"))
    return plans if explain else answer


def query_plan(conn: Connection, statement: Any) -> list[str]:
    compiled = statement.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params: Any = compiled.params
    if compiled.positional:
        params = tuple(compiled.params[name] for name in compiled.positiontup or ())
    dialect = dialect_of_connection(conn)
    prefix = {"sqlite": "EXPLAIN QUERY PLAN ", "postgresql": "EXPLAIN ", "mysql": "EXPLAIN "}
    rows = conn.exec_driver_sql(prefix[dialect] + compiled.string, params).mappings().all()
    if dialect == "mysql":
        return [f"table={row['table']} type={row['type']} key={row['key']}" for row in rows]
    return [str(list(row.values())[-1]) for row in rows]


def is_full_scan(db: TestDB, line: str) -> bool:
    if db.dialect == "postgresql":
        return "Seq Scan" in line
    if db.dialect == "mysql":
        return "type=ALL" in line
    return bool(re.search(r"\bSCAN (outbox_messages|provider_events)\b", line))


# --- the cache itself ---------------------------------------------------------------------------


async def test_concurrent_scrapes_make_one_read_and_share_its_values():
    cache = OutboxGaugeCache(15.0)
    reads = 0
    release = asyncio.Event()

    async def slow_read() -> None:
        nonlocal reads
        reads += 1
        await release.wait()

    first = asyncio.create_task(cache.refresh(slow_read))
    await asyncio.sleep(0)
    # A second scrape during the read waits for its values instead of reading again.
    second = asyncio.create_task(cache.refresh(slow_read))
    await asyncio.sleep(0.05)
    assert not second.done()
    release.set()
    assert await first is True
    assert await second is False
    assert await cache.refresh(slow_read) is False  # still within the window
    assert reads == 1


async def test_a_failed_read_is_not_retried_by_every_scrape():
    clock = [0.0]
    cache = OutboxGaugeCache(15.0, monotonic=lambda: clock[0])
    attempts = 0

    async def failing() -> None:
        nonlocal attempts
        attempts += 1
        raise OSError("database down")

    with pytest.raises(OSError):
        await cache.refresh(failing)
    assert await cache.refresh(failing) is False
    clock[0] = 15.0
    with pytest.raises(OSError):
        await cache.refresh(failing)
    assert attempts == 2


async def test_with_the_database_down_a_scrape_still_answers_with_the_last_reading(db):
    fill(db, {Status.PENDING: 3})
    async with api_client(db, metrics_cache_seconds=0) as api:
        assert "mailbag_messages" in (await api.get("/metrics")).text
        services = api._transport.app.state.services  # type: ignore[attr-defined]
        services.engine = make_async_engine("postgresql://nobody@127.0.0.1:1/none")
        down = await api.get("/metrics")
    assert down.status_code == 200
    assert gauge_values(down.text)[("mailbag_messages", (("state", "pending"),))] == 3


def test_every_gauge_says_how_processes_combine():
    gauges = [value for value in vars(metrics).values() if isinstance(value, Gauge)]
    assert gauges
    for gauge in gauges:
        assert gauge._multiprocess_mode != "all", gauge._name  # "all": a series per pid


def test_shared_metrics_makes_a_fresh_directory_and_removes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read afresh
    with shared_metrics(1):
        assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    with shared_metrics(2):
        directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        assert directory.parent == tmp_path and not any(directory.iterdir())
        (directory / "counter_1.db").write_bytes(b"")
    assert not directory.exists()
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


# --- `mailbag api --workers 2`, over real HTTP ----------------------------------------------------


@pytest.fixture
def api_fleet(db: TestDB, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """`mailbag api --workers 2` on a free port: (base URL, API key, its metrics directory)."""
    _, key = new_tenant(db, "fleet")
    port = free_port()
    env = mailbag_env(db.url, api_port=str(port), metrics_cache_seconds="0")
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env["TMPDIR"] = str(tmp_path)
    process = start_mailbag("api", "--workers", "2", env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        # Each process imports the app afresh (spawned): slow on a loaded machine.
        wait_until_up(f"{base}/healthz", timeout=START_TIMEOUT, process=process)
        (directory,) = tmp_path.glob("mailbag-metrics-*")
        yield base, key, directory
    finally:
        assert stop(process) == 0
    assert not list(tmp_path.glob("mailbag-metrics-*")), "the metrics directory was left"


def enqueued_by_process(directory: Path) -> dict[str, float]:
    """mailbag_enqueued_total as each process wrote it into the shared directory."""
    counts = {}
    for path in directory.glob("counter_*.db"):
        pid = path.stem.removeprefix("counter_")
        total = sum(
            sample.value
            for family in MultiProcessCollector.merge([str(path)])
            if family.name == "mailbag_enqueued"
            for sample in family.samples
            if sample.name == "mailbag_enqueued_total"
        )
        if total:
            counts[pid] = total
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_the_scraped_counter_is_the_fleet_total(api_fleet):
    base, key, directory = api_fleet
    headers = {"Authorization": f"Bearer {key}"}

    def post(_: int) -> int:
        # A connection each: the kernel hands each to whichever process accepts first.
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            return client.post("/v1/messages", json=BODY).status_code

    posted = 0
    with ThreadPoolExecutor(8) as pool:
        while len(enqueued_by_process(directory)) < 2 and posted < 400:
            assert set(pool.map(post, range(20))) == {201}
            posted += 20
    by_process = enqueued_by_process(directory)
    assert len(by_process) == 2, f"one process took all {posted} requests"
    assert sum(by_process.values()) == posted

    def scrape(_: int) -> str:
        with httpx.Client(base_url=base, timeout=30) as client:
            response = client.get("/metrics")
            assert response.status_code == 200
            return response.text

    with ThreadPoolExecutor(4) as pool:
        scrapes = list(pool.map(scrape, range(8)))
    for body in scrapes:
        values = gauge_values(body)
        assert values[("mailbag_enqueued_total", (("template", "welcome"),))] == posted
        # The gauges read from the database: one series, not one per process.
        assert values[("mailbag_messages", (("state", "pending"),))] == posted
        assert not any("pid" in dict(labels) for _, labels in values)
