"""Does the cost stay flat as the table grows? Claim latency, worker memory and API memory
with 10^4, 10^5 and 10^6 rows in outbox_messages, nearly all of them finished (sent), a
few due.

The finished rows are generated inside the database (generate_series / a recursive CTE),
which is how a year of traffic looks to the claim query: rows it must never touch. They
belong to the tenant the API is then asked about, so its lists run over all of them: one
`mailbag api` process, started on the grown database once the worker has drained, serves
a few hundred requests (POST /v1/messages with an Idempotency-Key, GET /v1/messages
pages, filtered by status and by recipient, followed by cursor, and GET of one message)
while its RSS is sampled.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from bench.common import (
    BENCH_SECRET_KEY,
    ROOT,
    Database,
    claim_batch,
    counts,
    finalize_all,
    free_port,
    rss_kib,
    scratch_database,
    seed,
    start_workers,
    stop_workers,
    wait_for_http,
    wait_until,
    worker_env,
)
from mailbag.domain.states import Action
from mailbag.services.tenants import create_tenant
from mailbag.store.database import make_async_engine

COLUMNS = (
    "id, tenant_id, to_address, template_name, template_data, headers, tags, metadata, "
    "status, attempt_count, max_attempts, next_attempt_at, created_at, updated_at, sent_at"
)
# Ids are UUIDv7 as mailbag makes them (domain/ids.py): time-ordered, the oldest row
# first, one every 10 s up to a day ago, so the table is laid out as years of traffic.
GENERATE = {
    "postgresql": f"""
        INSERT INTO outbox_messages ({COLUMNS})
        SELECT (lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
                || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
               :tenant, 'user' || g || '@example.com', 'welcome',
               '{{"name": "x"}}'::jsonb, '{{}}'::jsonb, '[]'::jsonb, '{{}}'::jsonb, 'sent', 1, 5,
               at, at, at, at
        FROM generate_series(1, :n) AS g,
             LATERAL (SELECT now() - interval '1 day' - (:n - g) * interval '10 s' AS at) AS t""",
    "sqlite": f"""
        WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < :n)
        INSERT INTO outbox_messages ({COLUMNS})
        SELECT printf('%012x', :day_ago_ms - (:n - x) * 10000) || '7'
               || substr(lower(hex(randomblob(2))), 1, 3) || '8'
               || substr(lower(hex(randomblob(8))), 1, 15),
               :tenant, 'user' || x || '@example.com', 'welcome',
               '{{"name": "x"}}', '{{}}', '[]', '{{}}', 'sent', 1, 5,
               '2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000',
               '2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000'
        FROM g""",
}
DUE = 1000
CLAIMS = 40


def fill(db: Database, finished: int, tenant_id: str) -> None:
    with db.engine.begin() as conn:
        day_ago_ms = int((time.time() - 86_400) * 1000)
        params = {"n": finished, "tenant": tenant_id, "day_ago_ms": day_ago_ms}
        conn.execute(text(GENERATE[db.dialect]), params)
        if db.dialect == "postgresql":
            conn.execute(text("ANALYZE outbox_messages"))


async def _claim_latencies(db: Database) -> list[float]:
    """Claim 100 due rows and hand them back, CLAIMS times; the claims are timed."""
    engine = make_async_engine(db.url, pool_size=2)
    timings = []
    try:
        for _ in range(CLAIMS):
            started = time.perf_counter()
            claim = await claim_batch(engine, db, "scale", 100)
            timings.append((time.perf_counter() - started) * 1000)
            await finalize_all(engine, db, claim, Action.RELEASE)
    finally:
        await engine.dispose()
    return timings


class PeakRss:
    """The highest RSS a process reaches while the block runs, sampled every 50 ms."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_kib = pid, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak_kib = max(self.peak_kib, rss_kib(self.pid))
            time.sleep(0.05)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak_kib = max(self.peak_kib, rss_kib(self.pid))

    @property
    def mib(self) -> float:
        return round(self.peak_kib / 1024, 1)


def _ms(timings: list[float], share: float) -> float:
    ordered = sorted(timings)
    return round(ordered[int(share * (len(ordered) - 1))] * 1000, 2)


KINDS = ("post", "list", "list_sent", "list_to", "get")


async def _drive_api(base: str, key: str, requests: int, parallel: int = 8) -> dict[str, Any]:
    """About `requests` requests, in turn: a POST (with an Idempotency-Key), the newest
    page and two more by cursor, the same by status, the page of one recipient, and one
    message. Latencies per kind and the answers other than 2xx, for the record (the RSS is
    what is compared across sizes)."""
    headers = {"Authorization": f"Bearer {key}"}
    body = {"to": "ada@example.com", "template": "welcome", "data": {"name": "Ada"}}
    timings: dict[str, list[float]] = {kind: [] for kind in KINDS}
    failed: dict[str, int] = dict.fromkeys(KINDS, 0)
    seen: list[str] = []
    limits = httpx.Limits(max_connections=parallel)
    async with httpx.AsyncClient(
        base_url=base, headers=headers, limits=limits, timeout=60
    ) as client:

        async def timed(kind: str, request: Awaitable[httpx.Response]) -> httpx.Response:
            started = time.perf_counter()
            reply = await request
            timings[kind].append(time.perf_counter() - started)
            failed[kind] += not reply.is_success
            return reply

        async def one(i: int) -> None:
            kind = KINDS[i % len(KINDS)]
            if kind == "post":
                idempotency = {"Idempotency-Key": f"scale-{i}"}
                await timed(kind, client.post("/v1/messages", json=body, headers=idempotency))
            elif kind == "get":
                if seen:
                    await timed(kind, client.get(f"/v1/messages/{seen[i % len(seen)]}"))
            elif kind == "list_to":
                to = f"user{i * 7919 % 1000 + 1}@example.com"
                await timed(kind, client.get("/v1/messages", params={"to": to}))
            else:
                query: dict[str, Any] = {"limit": 100}
                if kind == "list_sent":
                    query["status"] = "sent"
                for _ in range(3):  # the newest page, then two more by the cursor it gave
                    reply = await timed(kind, client.get("/v1/messages", params=query))
                    if not reply.is_success or not reply.json()["next_cursor"]:
                        break
                    seen.extend(item["id"] for item in reply.json()["items"][:3])
                    query["cursor"] = reply.json()["next_cursor"]

        queue = list(range(requests))

        async def client_loop() -> None:
            while queue:
                await one(queue.pop(0))

        await asyncio.gather(*(client_loop() for _ in range(parallel)))
    return {
        **{
            f"api_{kind}_{name}_ms": _ms(found, share)
            for kind, found in timings.items()
            if found
            for name, share in (("p50", 0.5), ("p95", 0.95))
        },
        "api_failed": sum(failed.values()),
    }


def api_memory(db: Database, key: str, requests: int) -> dict[str, Any]:
    """Start `mailbag api` on the grown database, drive it, and read its RSS."""
    port = free_port()
    env = {
        "MAILBAG_DATABASE_URL": db.url,
        "MAILBAG_LOG_LEVEL": "WARNING",
        "MAILBAG_SECRET_KEY": BENCH_SECRET_KEY,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "mailbag", "api", "--port", str(port)],
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{base}/healthz", server)
        started_kib = rss_kib(server.pid)
        with PeakRss(server.pid) as peak:
            latencies = asyncio.run(_drive_api(base, key, requests))
    finally:
        stop_workers([server])
    return {
        "api_requests": requests,
        "api_started_rss_mib": round(started_kib / 1024, 1),
        "api_peak_rss_mib": peak.mib,
        **latencies,
    }


def scale(kind: str, total_rows: int, api_requests: int = 400) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, scratch_database(kind, Path(tmp)) as db:
        tenant, key = create_tenant(db.engine, "bench")
        fill(db, total_rows - DUE, tenant.id)
        seed(db, DUE)
        timings = asyncio.run(_claim_latencies(db))
        sink_dir = Path(tmp) / "sink"
        sink_dir.mkdir()
        # The grown rows are older than PURGE_AFTER_DAYS: the elected scheduler's first purge
        # would delete them while the count below waits for every row to be sent.
        env = worker_env(
            db, sink_dir, batch_size=100, concurrency=256, poll_interval=0.05, purge_after_days=0
        )
        (worker,) = start_workers(1, env)
        try:
            with PeakRss(worker.pid) as worker_peak:
                wait_until(lambda: counts(db).get("sent", 0) == total_rows, timeout=300)
                time.sleep(1)  # a few idle polls over the big table
        finally:
            stop_workers([worker])
        api = api_memory(db, key, api_requests)
    return {
        "database": kind,
        "rows": total_rows,
        "due": DUE,
        "claim_p50_ms": round(statistics.median(timings), 2),
        "claim_p95_ms": round(sorted(timings)[int(0.95 * (len(timings) - 1))], 2),
        "worker_peak_rss_mib": worker_peak.mib,
        **api,
    }
