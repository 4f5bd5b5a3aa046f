"""The HTTP section of the benchmark (mailbag's API beside its stack's ceiling) runs end to
end at a tiny size; no timing is asserted."""

from __future__ import annotations

import os
import shutil

import pytest

from bench import http_api


@pytest.mark.slow
def test_the_http_section_runs_beside_its_ceiling():
    if shutil.which("wrk") is None and not os.environ.get("CI"):
        pytest.skip("wrk is not installed (Debian package `wrk`); CI installs it")
    rows = http_api.run(quick=True)
    rounds = [r for r in rows if "round" in r]
    assert {r["endpoint"] for r in rounds} == {
        http_api.MESSAGES,
        http_api.VERIFICATIONS,
        http_api.VERIFICATIONS_MANY,
    }
    for row in rounds:
        assert row["per_second"] > 0 and row["ceiling_per_second"] > 0
        assert row["ratio"] == round(row["per_second"] / row["ceiling_per_second"], 3)
        assert (row["non_2xx"], row["duplicates"]) == (0, 0)
    latency = [r for r in rows if "p99_ms" in r]
    assert len(latency) == 2
    for row in latency:
        assert row["failures"] == 0 and row["p99_ms"] >= row["p50_ms"] > 0
