"""Does the cost stay flat as the table grows? Claim latency and worker memory with 10^4,
10^5 and 10^6 rows in outbox_messages, nearly all of them finished (sent), a few due.

The finished rows are generated inside the database (generate_series / a recursive CTE),
which is how a year of traffic looks to the claim query: rows it must never touch.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.common import (
    Database,
    claim_batch,
    counts,
    finalize_all,
    rss_kib,
    scratch_database,
    seed,
    start_workers,
    stop_workers,
    wait_until,
    worker_env,
)
from mailbag.domain.states import Action
from mailbag.store.database import make_async_engine

COLUMNS = (
    "id, tenant_id, to_address, template_name, template_data, headers, tags, metadata, "
    "status, attempt_count, max_attempts, next_attempt_at, created_at, updated_at, sent_at"
)
GENERATE = {
    "postgresql": f"""
        INSERT INTO outbox_messages ({COLUMNS})
        SELECT gen_random_uuid(), 'default', 'user' || g || '@example.com', 'welcome',
               '{{"name": "x"}}'::jsonb, '{{}}'::jsonb, '[]'::jsonb, '{{}}'::jsonb, 'sent', 1, 5,
               now() - interval '1 day', now() - interval '1 day', now() - interval '1 day',
               now() - interval '1 day'
        FROM generate_series(1, :n) AS g""",
    "sqlite": f"""
        WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < :n)
        INSERT INTO outbox_messages ({COLUMNS})
        SELECT lower(hex(randomblob(16))), 'default', 'user' || x || '@example.com', 'welcome',
               '{{"name": "x"}}', '{{}}', '[]', '{{}}', 'sent', 1, 5,
               '2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000',
               '2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000'
        FROM g""",
}
DUE = 1000
CLAIMS = 40


def fill(db: Database, finished: int) -> None:
    with db.engine.begin() as conn:
        conn.execute(text(GENERATE[db.dialect]), {"n": finished})
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


def scale(kind: str, total_rows: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, scratch_database(kind, Path(tmp)) as db:
        fill(db, total_rows - DUE)
        seed(db, DUE)
        timings = asyncio.run(_claim_latencies(db))
        sink_dir = Path(tmp) / "sink"
        sink_dir.mkdir()
        env = worker_env(db, sink_dir, batch_size=100, concurrency=256, poll_interval=0.05)
        (worker,) = start_workers(1, env)
        peak = 0
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, rss_kib(worker.pid))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            wait_until(lambda: counts(db).get("sent", 0) == total_rows, timeout=300)
            time.sleep(1)  # a few idle polls over the big table
        finally:
            done.set()
            sampler.join()
            stop_workers([worker])
    return {
        "database": kind,
        "rows": total_rows,
        "due": DUE,
        "claim_p50_ms": round(statistics.median(timings), 2),
        "claim_p95_ms": round(sorted(timings)[int(0.95 * (len(timings) - 1))], 2),
        "worker_peak_rss_mib": round(peak / 1024, 1),
    }
