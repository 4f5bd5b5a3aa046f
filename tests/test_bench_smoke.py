"""The benchmark harness runs end to end at a tiny size (no timing is asserted)."""

from __future__ import annotations

import pytest

from bench import dispatch, enqueue, latency, scale


@pytest.mark.slow
def test_the_harness_runs_on_sqlite():
    drained = dispatch.throughput("sqlite", 60, 1)
    assert (drained["messages"], drained["duplicates"], drained["missing"]) == (60, 0, 0)
    assert drained["per_second"] > 0
    bare = dispatch.ceiling("sqlite", 60)
    assert bare["messages"] == 60
    waited = latency.latency("sqlite", 20, 1, poll_interval=0.05)
    assert waited["messages"] == 20 and waited["p99_ms"] >= waited["p50_ms"] >= 0
    assert enqueue.single("sqlite", 20)["per_second"] > 0
    assert enqueue.bulk("sqlite", 200, chunk=100)["per_second"] > 0
    assert enqueue.http("sqlite", 20)["per_second"] > 0  # one real `mailbag api` process
    grown = scale.scale("sqlite", 1200, api_requests=40)
    assert grown["rows"] == 1200 and grown["worker_peak_rss_mib"] > 0
