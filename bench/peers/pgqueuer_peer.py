"""PgQueuer (PostgreSQL job queue, asyncpg) doing mailbag's benchmark job, configured for
throughput the way PgQueuer's own benchmark tool (tools/benchmark.py in its repository)
runs its consumers.

Configuration, and why:
- Schema: `Queries(AsyncpgDriver(conn)).install()` (the same SQL as `pgq install`,
  default durability `durable`, so both sides write a WAL-logged table with fsync on) on
  a scratch database `bench_peer_pgqueuer_*`.
- Workers: W processes `python -m bench.peers.pgqueuer_peer`, each with ONE asyncpg
  connection (the driver PgQueuer's docs lead with, and the faster of its two: its own
  benchmark measured asyncpg at about twice psycopg's rate) and ONE `QueueManager` on it,
  run as its benchmark tool runs each consumer: `qm.run(batch_size=100)`. The batch size
  is the same as mailbag's worker gets in its benchmark (BATCH_SIZE=100); PgQueuer's
  default of 10 costs it a dequeue round trip per 10 jobs and is what held the earlier
  runs of this peer at about 4,100 jobs/s. `max_concurrent_tasks` unset (no limit, the
  tool's default too), no per-entrypoint limits, LISTEN/NOTIFY on the default channel,
  dequeue timeout 30 s, heartbeat 30 s, completions through its buffered status log
  (the defaults). Logging at WARNING, as for the other peers.
- Job: one `async def` entrypoint `welcome` that decodes the JSON payload
  {message_id, recipient, name}, renders mailbag's built-in `welcome` template (subject,
  HTML, text) with Jinja through mailbag's own Catalog (common.render_welcome: the same
  code and cost as mailbag's worker, so the figures compare the queues), and hands the
  id to the benchmark sink: the email outbox's work without the outbox.
- Enqueue and timing (`run`): as mailbag's dispatch benchmark: the workers start and wait
  idle (3 s), then every job is enqueued in ONE transaction (`Queries.enqueue` with
  lists, 1,000 jobs per statement); the clock runs from its COMMIT to the last hand-off.
- Stop: SIGTERM sets the QueueManager's shutdown event (PgQueuer's graceful stop).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries
from pgqueuer.qm import QueueManager

from bench.peers import common
from bench.peers.common import PeerResult, deliver, drain_idle, make_jobs, python_command

WORKER_MODULE = "bench.peers.pgqueuer_peer"
URL_ENV = "BENCH_PGQUEUER_URL"
ENTRYPOINT = "welcome"
ENQUEUE_BATCH = 1000
BATCH_SIZE = 100  # qm.run(batch_size=...): jobs per dequeue, as mailbag's BATCH_SIZE


async def consume(url: str) -> None:
    """One worker process: one connection, one QueueManager, until SIGTERM."""
    connection = await asyncpg.connect(url)
    qm = QueueManager(Queries(AsyncpgDriver(connection)))

    @qm.entrypoint(ENTRYPOINT)
    async def welcome(job: Job) -> None:
        assert job.payload is not None
        data = json.loads(job.payload)
        deliver(data["message_id"], data["name"])

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, qm.shutdown.set)
    try:
        await qm.run(batch_size=BATCH_SIZE)
    finally:
        await connection.close()


async def _install(url: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await Queries(AsyncpgDriver(connection)).install()
    finally:
        await connection.close()


async def _enqueue(url: str, jobs: list[common.Job]) -> None:
    connection = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(connection))
        async with connection.transaction():  # all jobs visible at once, as mailbag's seed
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
    startup: float = 3.0,
) -> PeerResult:
    batch = make_jobs(jobs)
    with common.scratch_database("pgqueuer", postgres_url) as url:
        asyncio.run(_install(url))
        commands = [worker_command()] * workers
        return drain_idle(
            "pgqueuer",
            batch,
            commands,
            lambda: asyncio.run(_enqueue(url, batch)),
            {URL_ENV: url},
            timeout,
            startup=startup,
            database_url=url,
        )


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(consume(os.environ[URL_ENV]))
