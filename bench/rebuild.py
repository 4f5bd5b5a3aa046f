"""What migration 0013 (exact text on MariaDB) costs on a large outbox: `python -m bench.rebuild`.

A scratch MariaDB database at revision 0012 is filled inside the server (INSERT ... SELECT
from the Sequence engine; untimed) with `--rows` messages and two events each. Each run then
times, on the same rows:
- the floor: `ALTER TABLE ... FORCE` of outbox_messages and message_events, the copy any
  rebuild of those tables makes (no collation changes);
- the upgrade to 0013 (`migrate.upgrade`), which converts every table;
and goes back to 0012 untimed. The figure is the upgrade beside the floor measured in the
same run, as a ratio, with its spread over `--runs`. Results: bench/results/rebuild.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from mailbag.store import migrate
from mailbag.store.database import make_engine

RESULTS = Path(__file__).parent / "results" / "rebuild.json"
BEFORE = "0012_purge_index"

FILL_MESSAGES = """
INSERT INTO outbox_messages (
    id, tenant_id, idempotency_key, to_address, subject, template_name, template_data,
    headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at,
    claim_order_at, created_at, updated_at, provider, provider_message_id, sent_at)
SELECT UUID(), CONCAT('tenant-', seq % 4), CONCAT('order-', MD5(seq)),
       CONCAT('user', (seq * 2654435761) % 1000003, '@example.com'),
       CONCAT('Your order ', seq), 'welcome', JSON_OBJECT('name', CONCAT('User ', seq)),
       '{{}}', '[]', '{{}}', 'sent', 1, 5, NOW(6), NOW(6), NOW(6), NOW(6), 'ses',
       CONCAT('0100018c', MD5(seq), '-000000'), NOW(6)
FROM seq_1_to_{rows}
"""
FILL_EVENTS = """
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt)
SELECT id, NULL, 'pending', created_at, 'api', 0 FROM outbox_messages
UNION ALL
SELECT id, 'processing', 'sent', updated_at, 'worker', 1 FROM outbox_messages
"""


def _timed(work: Any) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def run(url: str, rows: int, runs: int, scratch: str = "mailbag_bench_rebuild") -> dict[str, Any]:
    """Fill the scratch database `scratch` on the server of `url`, time `runs` rounds, drop it."""
    server = make_engine(url, null_pool=True)
    with server.begin() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {scratch}"))
        conn.execute(text(f"CREATE DATABASE {scratch}"))
    engine = make_engine(make_url(url).set(database=scratch), null_pool=True)
    try:
        migrate.upgrade(engine, BEFORE)
        with engine.begin() as conn:
            conn.execute(text(FILL_MESSAGES.format(rows=rows)))
            conn.execute(text(FILL_EVENTS))

        def floor() -> None:
            with engine.begin() as conn:
                conn.execute(text("ALTER TABLE outbox_messages FORCE"))
                conn.execute(text("ALTER TABLE message_events FORCE"))

        timed = []
        for n in range(runs):
            floor_seconds = _timed(floor)
            upgrade_seconds = _timed(lambda: migrate.upgrade(engine))
            migrate.downgrade(engine, BEFORE)
            timed.append({"floor_seconds": floor_seconds, "upgrade_seconds": upgrade_seconds})
            print(f"run {n + 1}: floor {floor_seconds:.1f} s, upgrade {upgrade_seconds:.1f} s")
    finally:
        engine.dispose()
        with server.begin() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {scratch}"))
        server.dispose()
    ratios = [r["upgrade_seconds"] / r["floor_seconds"] for r in timed]
    upgrade = statistics.median(r["upgrade_seconds"] for r in timed)
    return {
        "rows": rows,
        "events": 2 * rows,
        "runs": timed,
        "upgrade_seconds_median": round(upgrade, 1),
        "upgrade_rows_per_second_median": round(rows / upgrade),
        "ratio_to_floor_median": round(statistics.median(ratios), 2),
        "ratio_to_floor_range": [round(min(ratios), 2), round(max(ratios), 2)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--url", default="mysql://root@127.0.0.1:3306/test")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    summary = run(args.url, args.rows, args.runs)
    print(json.dumps(summary, indent=2))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
