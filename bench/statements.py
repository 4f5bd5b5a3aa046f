"""Where one worker's time goes, statement by statement, and what the server does with a claim.

    python -m bench.statements                 # one worker draining 20,000 on PostgreSQL
    python -m bench.statements --explain       # EXPLAIN (ANALYZE) of claims of 100

The first runs `bench.worker_main` with every statement counted by SQLAlchemy's events
(calls, rows, and the time the client saw, the event loop's waits included) and prints
the table, with the worker's and the PostgreSQL server processes' CPU a message. The
second seeds 20,000, runs three claims and finalizes through the worker's statements, then
EXPLAINs the last claim four times on one connection (the first on cold catalog caches).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from bench.common import (
    claim_batch,
    counts,
    finalize_all,
    scratch_database,
    seed,
    start_workers,
    stop_workers,
    wait_until,
    worker_env,
)
from bench.dispatch import STARTUP_SECONDS, WORKER_SETTINGS
from bench.peers.common import cpu_seconds, postgres_backends

OUT = "BENCH_STATEMENTS_OUT"


def counted_worker() -> None:
    """bench.worker_main, its statements counted and written to $BENCH_STATEMENTS_OUT."""
    stats: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0])

    @event.listens_for(Engine, "before_cursor_execute")
    def started(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        conn.info["bench_started"] = time.perf_counter()

    @event.listens_for(Engine, "after_cursor_execute")
    def ended(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        row = stats[" ".join(statement.split())[:110]]
        row[0] += 1
        row[1] += max(cursor.rowcount, 0)
        row[2] += time.perf_counter() - conn.info.get("bench_started", time.perf_counter())

    def written() -> None:
        rows = sorted(([k, *v] for k, v in stats.items()), key=lambda r: -float(r[3]))
        Path(os.environ[OUT]).write_text(json.dumps(rows))

    atexit.register(written)
    from bench.worker_main import main

    main()


def drain(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, scratch_database("postgresql", Path(tmp)) as db:
        sink_dir = Path(tmp) / "sink"
        sink_dir.mkdir()
        env = worker_env(db, sink_dir, **WORKER_SETTINGS)
        env[OUT] = str(Path(tmp) / "statements.json")
        workers = start_workers(1, env, "bench.statements")
        try:
            time.sleep(STARTUP_SECONDS)
            db.engine.dispose()  # the seed's server process is not the worker's
            servers = postgres_backends(db.url)
            worker_before = cpu_seconds([w.pid for w in workers])
            server_before = cpu_seconds(servers)
            seed(db, n)
            started = time.time()
            wait_until(lambda: counts(db).get("sent", 0) == n, timeout=900, interval=0.1)
            seconds = time.time() - started
            worker_cpu = cpu_seconds([w.pid for w in workers]) - worker_before
            server_cpu = cpu_seconds(servers) - server_before
        finally:
            stop_workers(workers)
        print(
            f"{n / seconds:.0f} messages/s; CPU a message: worker {worker_cpu * 1e6 / n:.1f} µs, "
            f"PostgreSQL {server_cpu * 1e6 / n:.1f} µs"
        )
        for statement, calls, rows, spent in json.loads(Path(env[OUT]).read_text()):
            each = spent * 1e6 / n
            print(f"{each:7.1f} µs a message {calls:6.0f} calls {rows:7.0f} rows  {statement}")


async def explain(n: int) -> None:
    from mailbag.domain.states import Action
    from mailbag.store.database import make_async_engine

    with tempfile.TemporaryDirectory() as tmp, scratch_database("postgresql", Path(tmp)) as db:
        seed(db, n)
        engine = make_async_engine(db.url)
        claims: list[tuple[str, Any]] = []

        @event.listens_for(engine.sync_engine, "before_cursor_execute")
        def seen(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
            if statement.lstrip().startswith("WITH RECURSIVE"):
                claims.append((statement, params))

        for _ in range(3):
            claim = await claim_batch(engine, db, "bench", 100)
            await finalize_all(engine, db, claim, Action.MARK_SENT)
        await engine.dispose()
        statement, params = claims[-1]
        with db.engine.connect() as conn:
            for _ in range(4):
                plan = conn.exec_driver_sql(
                    "EXPLAIN (ANALYZE, BUFFERS, SUMMARY) " + statement, params
                ).scalars()
                print([line for line in plan if "Time" in line or "Update on" in line])
                conn.rollback()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--explain", action="store_true")
    args = parser.parse_args()
    if args.explain:
        asyncio.run(explain(args.messages))
    else:
        drain(args.messages)


if __name__ == "__main__":
    if os.environ.get(OUT):
        counted_worker()
    else:
        main()
    sys.exit(0)
