"""PgQueuer (PostgreSQL job queue, asyncpg) doing mailbag's benchmark job.

Configuration:
- Schema: `Queries(AsyncpgDriver(conn)).install()` (the same SQL as `pgq install`,
  default durability `durable`) on a scratch database `bench_peer_pgqueuer_*`.
- Enqueue (not timed): `Queries.enqueue(entrypoints, payloads, priorities)` with lists,
  1,000 jobs per round trip, before any worker starts; the payload is JSON
  {message_id, recipient, name}. Then `ANALYZE`, as autovacuum would have done in a
  running system.
- Workers: W processes `python -m bench.peers.pgqueuer_peer`, each calling
  `pgqueuer.run(create_pgqueuer)`: PgQueuer's documented programmatic twin of
  `pgq run bench.peers.pgqueuer_peer:create_pgqueuer` (same supervisor, same defaults,
  same SIGINT/SIGTERM handling). The CLI itself cannot start here: with typer 0.29,
  `pgq run` crashes before the factory loads (`--log-level` reaches
  `setup_fancy_logger` as a str: AttributeError: 'str' object has no attribute 'name').
  The factory opens one asyncpg connection (asyncpg is the driver PgQueuer's docs lead
  with) and yields a `PgQueuer` with one `async def` entrypoint `welcome`.
  Everything else is PgQueuer's default: LISTEN/NOTIFY on its default channel, dequeue
  batch size 10, dequeue timeout 30 s (the polling fallback), no concurrency limits
  (per entrypoint or per worker), heartbeat timeout 30 s, completions logged through
  its buffered status log. Logging at WARNING, as for the other peers (`pgq run`
  would log INFO; PgQueuer logs nothing per job at INFO either way).
- Stop: SIGTERM, PgQueuer's graceful shutdown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pgqueuer
from pgqueuer import AsyncpgDriver, Job, PgQueuer, Queries

from bench.peers import common
from bench.peers.common import PeerResult, deliver, drain, make_jobs, python_command

WORKER_MODULE = "bench.peers.pgqueuer_peer"
URL_ENV = "BENCH_PGQUEUER_URL"
ENTRYPOINT = "welcome"
ENQUEUE_BATCH = 1000


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    """The factory `pgq run` calls in each worker process."""
    connection = await asyncpg.connect(os.environ[URL_ENV])
    pgq = PgQueuer.from_asyncpg_connection(connection)

    @pgq.entrypoint(ENTRYPOINT)
    async def welcome(job: Job) -> None:
        assert job.payload is not None
        data = json.loads(job.payload)
        deliver(data["message_id"], data["name"])

    try:
        yield pgq
    finally:
        await connection.close()


async def _prepare(url: str, jobs: list[common.Job]) -> None:
    connection = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(connection))
        await queries.install()
        for start in range(0, len(jobs), ENQUEUE_BATCH):
            chunk = jobs[start : start + ENQUEUE_BATCH]
            await queries.enqueue(
                [ENTRYPOINT] * len(chunk),
                [json.dumps(job.as_dict()).encode() for job in chunk],
                [0] * len(chunk),
            )
    finally:
        await connection.close()


def worker_command() -> list[str]:
    return python_command("-m", WORKER_MODULE)


def run(
    jobs: int,
    workers: int,
    *,
    postgres_url: str | None = None,
    timeout: float = 600.0,
) -> PeerResult:
    batch = make_jobs(jobs)
    with common.scratch_database("pgqueuer", postgres_url) as url:
        asyncio.run(_prepare(url, batch))
        common.analyze(url)
        commands = [worker_command()] * workers
        return drain("pgqueuer", batch, commands, {URL_ENV: url}, timeout)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    # No shutdown event given: pgqueuer.run installs its own SIGINT/SIGTERM handlers.
    asyncio.run(pgqueuer.run(create_pgqueuer))
