"""The mailbag-against-PgQueuer section runs end to end at a tiny size (no timing is
asserted): both sides drain every message exactly once. Needs PostgreSQL
(MAILBAG_TEST_POSTGRES_URL); skipped without it, except under CI=true."""

from __future__ import annotations

import os

import pytest

from bench import versus
from bench.peers import common

from conftest import IN_CI

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_versus_quick_runs_both_sides() -> None:
    url = os.environ.get("MAILBAG_TEST_POSTGRES_URL", "")
    problem = common.postgres_problem(url) if url else "MAILBAG_TEST_POSTGRES_URL not set"
    if problem is not None:
        if IN_CI:
            pytest.fail(f"CI=true: {problem}")
        pytest.skip(problem)
    rows = versus.run(quick=True)
    assert rows
    for row in rows:
        assert row["mailbag_per_second"] > 0 and row["pgqueuer_per_second"] > 0
        assert row["ratio"] > 0
        for key in ("mailbag_duplicates", "mailbag_missing", "pgqueuer_duplicates",
                    "pgqueuer_missing"):  # fmt: skip
            assert row[key] == 0, (key, row)
