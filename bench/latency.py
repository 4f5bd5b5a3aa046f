"""Enqueue-to-hand-off latency at a steady offered load, on an otherwise idle system.

One worker process waits (PostgreSQL: LISTEN/NOTIFY wakes it; SQLite: it polls); another
process enqueues one message per transaction at a fixed rate. Latency is the sink's
hand-off time minus the moment the enqueuing transaction committed (what an application
experiences); the time from the enqueue call (created_at) is reported too.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from bench import sink
from bench.common import (
    ROOT,
    counts,
    scratch_database,
    start_workers,
    stop_workers,
    wait_until,
    worker_env,
)
from mailbag.store.schema import outbox_messages


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def latency(kind: str, rate: int, seconds: float, *, poll_interval: float = 1.0) -> dict[str, Any]:
    total = int(rate * seconds)
    with tempfile.TemporaryDirectory() as tmp, scratch_database(kind, Path(tmp)) as db:
        sink_dir = Path(tmp) / "sink"
        sink_dir.mkdir()
        env = worker_env(db, sink_dir, batch_size=100, concurrency=256, poll_interval=poll_interval)
        workers = start_workers(1, env)
        commits = Path(tmp) / "commits.txt"
        try:
            time.sleep(3)
            subprocess.run(
                [sys.executable, "-m", "bench.offer", db.url, str(rate), str(total), str(commits)],
                cwd=ROOT,
                check=True,
            )
            wait_until(lambda: counts(db).get("sent", 0) == total, timeout=300, interval=0.1)
        finally:
            stop_workers(workers)
        handed = dict(sink.read_all(sink_dir))
        committed = {
            m: float(at) for m, at in (line.split() for line in commits.read_text().splitlines())
        }
        with db.engine.connect() as conn:
            created = {
                str(row.id): row.created_at.timestamp()
                for row in conn.execute(select(outbox_messages.c.id, outbox_messages.c.created_at))
            }
    after_commit = [(handed[m] - at) * 1000 for m, at in committed.items()]
    after_call = [(handed[m] - at) * 1000 for m, at in created.items()]
    span = max(committed.values()) - min(committed.values())
    return {
        "database": kind,
        "offered_per_second": rate,
        "achieved_per_second": round((total - 1) / span) if span else None,
        "messages": total,
        "poll_interval": poll_interval,
        "p50_ms": round(percentile(after_commit, 50), 2),
        "p95_ms": round(percentile(after_commit, 95), 2),
        "p99_ms": round(percentile(after_commit, 99), 2),
        "max_ms": round(max(after_commit), 2),
        "mean_ms": round(statistics.fmean(after_commit), 2),
        "p99_from_enqueue_call_ms": round(percentile(after_call, 99), 2),
    }
