"""The peer benchmarks work: each peer drains a few jobs, every job handed off exactly once.

Needs PostgreSQL (MAILBAG_TEST_POSTGRES_URL) for procrastinate and PgQueuer, and Redis at
127.0.0.1:6379 (BENCH_REDIS_URL overrides it) for Celery. A missing server skips that
peer, except when CI=true: then it fails. Nothing here is timed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from bench.peers import common

from conftest import IN_CI

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

JOBS = 50


def unusable(problem: str | None) -> None:
    if problem is None:
        return
    if IN_CI:
        pytest.fail(f"CI=true: {problem}")
    pytest.skip(problem)


def postgres() -> str:
    url = os.environ.get("MAILBAG_TEST_POSTGRES_URL", "")
    unusable(
        common.postgres_problem(url)
        if url
        else "MAILBAG_TEST_POSTGRES_URL not set: PostgreSQL peers skipped"
    )
    return url


def run_procrastinate() -> common.PeerResult:
    from bench.peers import procrastinate_peer

    return procrastinate_peer.run(JOBS, 1, postgres_url=postgres(), timeout=60)


def run_pgqueuer() -> common.PeerResult:
    from bench.peers import pgqueuer_peer

    return pgqueuer_peer.run(JOBS, 1, postgres_url=postgres(), timeout=60)


def run_celery() -> common.PeerResult:
    from bench.peers import celery_peer

    url = common.redis_url()
    unusable(common.redis_problem(url))
    return celery_peer.run(JOBS, 1, broker_url=url, timeout=60)


@pytest.mark.parametrize(
    "run_peer",
    [run_procrastinate, run_pgqueuer, run_celery],
    ids=["procrastinate", "pgqueuer", "celery"],
)
def test_peer_hands_off_every_job_once(run_peer: Callable[[], common.PeerResult]) -> None:
    result = run_peer()
    assert result.jobs == JOBS
    assert result.missing == 0, result
    assert result.duplicates == 0, result
    assert result.workers == 1


def test_tally_counts_duplicates_and_missing() -> None:
    notes = [("a", 10.0), ("b", 11.0), ("a", 12.5), ("x", 13.0)]
    result = common.tally("p", 2, {"a", "b", "c"}, notes, started=10.0)
    assert (result.duplicates, result.missing) == (1, 1)
    assert result.seconds == 3.0
    assert result.per_second == round(2 / 3.0, 1)  # distinct expected ids per second
