"""The retention benchmark (bench/rows.py, docs/scaling.md) runs end to end at a tiny size,
and what it fills and measures is what it says: the status mix and the events each path
leaves, a purge that removes exactly the finished rows older than the retention, and a
VACUUM that leaves no dead tuples.

It needs PostgreSQL (MAILBAG_TEST_POSTGRES_URL); without one it is skipped, except when
CI=true: then it fails.
"""

from __future__ import annotations

import os
import uuid

import pytest
from sqlalchemy import text

from bench import common, rows
from bench.peers.common import postgres_problem
from mailbag.store.database import make_engine

from conftest import IN_CI

ROWS, REFERENCE = 5000, 2000


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_rows_benchmark_runs_tiny_and_measures_what_it_filled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = os.environ.get("MAILBAG_TEST_POSTGRES_URL", "")
    problem = postgres_problem(url) if url else "MAILBAG_TEST_POSTGRES_URL not set"
    if problem is not None:
        if IN_CI:
            pytest.fail(f"CI=true: {problem}")
        pytest.skip(problem)
    monkeypatch.setattr(common, "PG_BASE", url)  # where its scratch databases are made
    prefix = f"mailbag_rows_{uuid.uuid4().hex[:8]}"

    try:
        result = rows.run(
            ROWS,
            REFERENCE,
            rounds=2,
            claims=5,
            purge_seconds=30,
            prefix=prefix,
            keep=True,
            progress=lambda line: None,
        )
        for size in (ROWS, REFERENCE):
            engine = make_engine(rows.database_url(f"{prefix}_{size}"), null_pool=True)
            try:
                with engine.connect() as conn:
                    statuses = "SELECT status, count(*) FROM outbox_messages GROUP BY status"
                    by_status = {row[0]: row[1] for row in conn.execute(text(statuses))}
                    events = conn.execute(text("SELECT count(*) FROM message_events")).scalar()
            finally:
                engine.dispose()
            purged = result[f"purge_{size}"]["messages_deleted"]
            assert purged == result["purge_eligible"][str(size)] > 0
            # Released claims went back: the queue is whole, and only finished rows went.
            assert by_status["pending"] == rows.DUE and by_status["retrying"] == rows.WAITING
            assert sum(by_status.values()) == size - purged
            # Each message keeps its path's events, plus a claim and a release per claim.
            claimed = result["claim"][str(size)]["claims"] * rows.BATCH
            path_events = sum(len(rows.PATHS[s]) * n for s, n in by_status.items())
            assert events == path_events + 2 * claimed
    finally:
        for size in (ROWS, REFERENCE):
            rows.drop(f"{prefix}_{size}")

    claim = result["claim"]
    assert claim[str(ROWS)]["claims"] == claim[str(REFERENCE)]["claims"] == 10
    assert 0 < claim[str(REFERENCE)]["p50_ms"] <= claim[str(REFERENCE)]["p99_ms"]
    assert result[f"purge_{ROWS}"]["finished"] is True
    assert (
        result["tuples_after_purge"]["outbox_messages"]["dead"]
        >= result[f"purge_{ROWS}"]["messages_deleted"]
    )
    assert result["tuples_after_vacuum"]["outbox_messages"]["dead"] == 0
    sized = {entry["relname"] for entry in result["sizes"][str(ROWS)]}
    assert {"outbox_messages", "message_events", "ix_outbox_messages_claimable"} <= sized
