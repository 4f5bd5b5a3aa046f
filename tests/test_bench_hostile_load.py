"""The hostile-load benchmark (bench/hostile_load.py, docs/benchmarks.md) runs end to end at a
tiny size against a real `mailbag api`, with the limits set small (no timing is asserted
beyond the limits themselves)."""

from __future__ import annotations

import pytest

from bench import hostile_load


@pytest.mark.slow
def test_the_hostile_load_benchmark_runs_tiny():
    summary = hostile_load.run(
        clients=4,
        body_mib=2,
        keyed=0,
        hold=5,
        every=0.5,
        settle=0.2,
        settings={
            "api_header_timeout_seconds": "1",
            "api_body_timeout_seconds": "1",
            "api_keep_alive_seconds": "1",
        },
    )
    unauthenticated = summary["unauthenticated"]
    assert all(answer.startswith("401") for answer in unauthenticated["answers"])
    assert sum(unauthenticated["answers"].values()) == 4
    assert unauthenticated["rss_peak_mib"] >= unauthenticated["rss_before_mib"] > 0
    slow = summary["slow_connections"]
    assert [r["connection"] for r in slow] == list(hostile_load.SLOW)
    assert all(r["closed_by_server"] and r["open_seconds"] < 4 for r in slow), slow
