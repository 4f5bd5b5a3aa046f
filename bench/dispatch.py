"""Dispatch throughput: N pending messages drained by W worker processes, and the ceiling.

The clock starts when the seeding transaction commits (all N rows become visible at once,
to workers already running and idle) and stops at the last hand-off the sink noted.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import sink
from bench.common import (
    ROOT,
    Database,
    claim_batch,
    counts,
    finalize_all,
    free_port,
    scratch_database,
    seed,
    start_workers,
    stop_workers,
    wait_until,
    worker_env,
)
from bench.peers.common import cpu_seconds, postgres_backends
from mailbag.domain.states import Action
from mailbag.domain.templates import Pin
from mailbag.store.database import make_async_engine

WORKER_SETTINGS = {"batch_size": 100, "concurrency": 256, "poll_interval": 0.05}
STARTUP_SECONDS = 3.0


def drain(
    db: Database,
    n: int,
    workers: int,
    folder: Path,
    *,
    provider: str = "sink",
    sink_delay: float = 0.0,
    pin: Pin | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Seed N messages, let W workers (already started) drain them; rate and duplicates.
    `pin`: the tenant's template version they render with (common.seed)."""
    sink_dir = folder / f"sink-{time.monotonic_ns()}"
    sink_dir.mkdir()
    smtp = None
    if provider == "smtp":
        port = free_port()
        smtp = subprocess.Popen(
            [sys.executable, "-m", "bench.smtp_sink", str(port), str(sink_dir / "smtp.txt")],
            cwd=ROOT,
        )
        settings = {
            "provider": "smtp",
            "smtp_host": "127.0.0.1",
            "smtp_port": port,
            "smtp_tls": "none",
            **settings,
        }
    env = worker_env(db, sink_dir, **{**WORKER_SETTINGS, **settings})
    env["BENCH_SINK_DELAY"] = str(sink_delay)
    processes = start_workers(workers, env)
    try:
        time.sleep(STARTUP_SECONDS)  # imports, migrations check, first idle poll
        # Before the seed: its idle polls count too, the claims right after its commit must.
        cpu_before = cpu_seconds([p.pid for p in processes])
        db.engine.dispose()  # the seed's and the polls' server processes come after: not counted
        servers = postgres_backends(db.url) if db.dialect == "postgresql" else []
        server_before = cpu_seconds(servers)
        seed(db, n, pin=pin)
        committed = time.time()
        wait_until(lambda: counts(db).get("sent", 0) == n, timeout=900, interval=0.1)
        # Sampled once every message is sent: includes the last finalizes, not the exit.
        cpu = cpu_seconds([p.pid for p in processes]) - cpu_before
        # The seed's own server process is not among them: it connected afterwards.
        server_cpu = cpu_seconds(servers) - server_before
    finally:
        stop_workers(processes)
        if smtp is not None:
            smtp.terminate()
            smtp.wait()
    handed = sink.read_all(sink_dir)
    seconds = max(at for _, at in handed) - committed
    per_message = Counter(message_id for message_id, _ in handed)
    return {
        "database": db.dialect,
        "messages": n,
        "workers": workers,
        "seconds": round(seconds, 3),
        "per_second": round(n / seconds),
        "duplicates": sum(c - 1 for c in per_message.values() if c > 1),
        "missing": n - len(per_message),
        "provider": provider,
        "cpu_us_per_message": round(cpu * 1e6 / n, 1),
        "postgres_cpu_us_per_message": round(server_cpu * 1e6 / n, 1),
    }


def throughput(
    kind: str,
    n: int,
    workers: int,
    *,
    provider: str = "sink",
    sink_delay: float = 0.0,
    **settings: Any,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, scratch_database(kind, Path(tmp)) as db:
        return drain(
            db, n, workers, Path(tmp), provider=provider, sink_delay=sink_delay, **settings
        )


async def _bare_loop(db: Database, batch: int) -> int:
    """The worker's claim and finalize statements, back to back, nothing else."""
    engine = make_async_engine(db.url, pool_size=2)
    done = 0
    try:
        while True:
            claim = await claim_batch(engine, db, "ceiling", batch)
            if not claim.messages:
                return done
            await finalize_all(engine, db, claim, Action.MARK_SENT)
            done += len(claim.messages)
    finally:
        await engine.dispose()


def ceiling(kind: str, n: int, batch: int = WORKER_SETTINGS["batch_size"]) -> dict[str, Any]:
    """The same claim + finalize statements in one process's loop: no rendering, no sending."""
    with tempfile.TemporaryDirectory() as tmp, scratch_database(kind, Path(tmp)) as db:
        seed(db, n)
        started = time.perf_counter()
        done = asyncio.run(_bare_loop(db, batch))
        seconds = time.perf_counter() - started
    return {
        "database": kind,
        "messages": done,
        "batch": batch,
        "seconds": round(seconds, 3),
        "per_second": round(done / seconds),
    }
