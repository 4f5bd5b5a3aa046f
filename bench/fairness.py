"""Fair queues (issue 25): how long one message of tenant B waits behind tenant A's backlog.

`python -m bench.fairness postgresql --workers 4`: W real worker processes
(bench.worker_main: `mailbag worker` with the sink provider) on a scratch database; tenant
A's `--backlog` messages are seeded in one transaction, and `--after` seconds later, while
the workers drain them, tenant B enqueues one message. Measured: from the commit of B's
enqueue to its `sent_at` (what the worker recorded after the provider took it), and how
many of A's messages were still unsent then. Repeated `--runs` times.
For the figure before a change, run this file from the other checkout (its workers must
find their own schema).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from bench.common import (
    Database,
    scratch_database,
    seed,
    start_workers,
    stop_workers,
    wait_until,
    worker_env,
)
from bench.dispatch import STARTUP_SECONDS, WORKER_SETTINGS
from mailbag.clock import utcnow
from mailbag.domain.message import new_message
from mailbag.store import enqueue as enqueue_store
from mailbag.store.plan import run
from mailbag.store.schema import outbox_messages as om


def one_run(db: Database, folder: Path, backlog: int, workers: int, after: float) -> dict[str, Any]:
    env = worker_env(db, folder, **WORKER_SETTINGS)
    processes = start_workers(workers, env)
    try:
        time.sleep(STARTUP_SECONDS)
        seed(db, backlog)  # tenant "default": A
        time.sleep(after)
        message = new_message(
            to="b@example.com", template="welcome", data={"name": "B"}, tenant_id="tenant-b"
        )
        with db.engine.begin() as conn:
            [b] = run(conn, enqueue_store.enqueue([message], now=utcnow(), default_max_attempts=5))
        committed = utcnow()
        unsent_a = _unsent(db, "default")
        wait_until(lambda: _sent_at(db, b.message.id) is not None, timeout=120, interval=0.01)
        sent_at = _sent_at(db, b.message.id)
        unsent_a_then = _unsent(db, "default")
        wait_until(lambda: _unsent(db, "default") == 0, timeout=300, interval=0.1)
        drained = utcnow()
    finally:
        stop_workers(processes)
    assert sent_at is not None
    return {
        "b_waited_seconds": round((sent_at - committed).total_seconds(), 3),
        "a_unsent_when_b_enqueued": unsent_a,
        "a_unsent_when_b_sent": unsent_a_then,
        "a_drained_after_b_seconds": round((drained - committed).total_seconds(), 3),
    }


def _unsent(db: Database, tenant: str) -> int:
    query = select(func.count()).where(om.c.tenant_id == tenant, om.c.sent_at.is_(None))
    with db.engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def _sent_at(db: Database, message_id: Any) -> Any:
    with db.engine.connect() as conn:
        return conn.execute(select(om.c.sent_at).where(om.c.id == message_id)).scalar_one()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("database", choices=["postgresql", "mysql", "sqlite"])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--after", type=float, default=0.5, help="seconds after A's seed")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp, scratch_database(args.database, Path(tmp)) as db:
            runs.append(one_run(db, Path(tmp), args.backlog, args.workers, args.after))
    waits = sorted(r["b_waited_seconds"] for r in runs)
    print(
        json.dumps(
            {
                "database": args.database,
                "workers": args.workers,
                "backlog": args.backlog,
                "runs": runs,
                "b_waited_min_median_max": [waits[0], waits[len(waits) // 2], waits[-1]],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
