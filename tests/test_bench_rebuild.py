"""The MariaDB rebuild benchmark (bench/rebuild.py, docs/benchmarks.md) runs end to end at a
tiny size, times both sides, and leaves no scratch database behind."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from bench import rebuild
from mailbag.store.database import make_engine


@pytest.mark.slow
def test_the_rebuild_benchmark_runs_tiny_and_cleans_up(mysql_url: str) -> None:
    scratch = f"mailbag_rebuild_{uuid.uuid4().hex[:8]}"
    summary = rebuild.run(mysql_url, rows=500, runs=2, scratch=scratch)
    assert summary["rows"] == 500 and len(summary["runs"]) == 2
    assert all(r["floor_seconds"] > 0 and r["upgrade_seconds"] > 0 for r in summary["runs"])
    low, high = summary["ratio_to_floor_range"]
    assert 0 < low <= summary["ratio_to_floor_median"] <= high
    server = make_engine(mysql_url, null_pool=True)
    with server.connect() as conn:
        assert conn.execute(text(f"SHOW DATABASES LIKE '{scratch}'")).first() is None
    server.dispose()
