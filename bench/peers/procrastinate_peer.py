"""procrastinate (PostgreSQL job queue, psycopg 3) doing mailbag's benchmark job.

Configuration:
- Schema: `app.schema_manager.apply_schema_async()` on a scratch database
  `bench_peer_procrastinate_*`.
- Enqueue (not timed): `welcome.batch_defer_async(...)`, 1,000 jobs per INSERT, before
  any worker starts; each job's kwargs are message_id, recipient and name. Then
  `ANALYZE`, as autovacuum would have done in a running system.
- Workers: W processes of its own CLI, the production way:
  `python -m procrastinate --app bench.peers.procrastinate_peer.app --log-level warning
  worker --concurrency CONCURRENCY`.
  Everything else is procrastinate's default: LISTEN/NOTIFY on (polling fallback every
  5 s), jobs kept after completion (`delete_jobs=never`), a psycopg_pool
  AsyncConnectionPool with its default size (4 connections) plus the listener's own
  connection, heartbeats every 10 s. `--log-level warning` only silences the two INFO
  lines it logs per job (the CLI's default level is INFO).
- The task is `async def`, so it runs on the worker's event loop like mailbag's worker
  (a sync task would be pushed to a thread by procrastinate).
- Stop: SIGTERM, procrastinate's graceful shutdown.
"""

from __future__ import annotations

import asyncio
import os

import procrastinate
from procrastinate.types import JSONDict

from bench.peers.common import (
    Job,
    PeerResult,
    analyze,
    deliver,
    drain,
    make_jobs,
    python_command,
    scratch_database,
)

APP_PATH = "bench.peers.procrastinate_peer.app"
URL_ENV = "BENCH_PROCRASTINATE_URL"
# Parallel jobs per worker (procrastinate's default is 1). The job never awaits, so
# concurrency only overlaps the per-job fetch / finish round trips on 4 pooled
# connections. Tried 1, 8, 16, 32 with 3-5k jobs: 1 was slowest, 8-32 were within this
# machine's run-to-run noise of each other.
CONCURRENCY = 8
DEFER_BATCH = 1000

# The CLI imports this module in each worker; the connector opens lazily, so the
# parent can import it without a URL and swap the connector in `_prepare`.
app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get(URL_ENV, ""))
)


@app.task(name="welcome")
async def welcome(message_id: str, recipient: str, name: str) -> None:
    deliver(message_id, name)


async def _prepare(url: str, jobs: list[Job]) -> None:
    with app.replace_connector(procrastinate.PsycopgConnector(conninfo=url)):
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            for start in range(0, len(jobs), DEFER_BATCH):
                chunk = jobs[start : start + DEFER_BATCH]
                await welcome.batch_defer_async(*(_kwargs(job) for job in chunk))


def _kwargs(job: Job) -> JSONDict:
    return {"message_id": job.message_id, "recipient": job.recipient, "name": job.name}


def worker_command(concurrency: int = CONCURRENCY) -> list[str]:
    return python_command(
        "-m", "procrastinate", "--app", APP_PATH, "--log-level", "warning",
        "worker", "--concurrency", str(concurrency),
    )  # fmt: skip


def run(
    jobs: int,
    workers: int,
    *,
    postgres_url: str | None = None,
    concurrency: int = CONCURRENCY,
    timeout: float = 600.0,
) -> PeerResult:
    batch = make_jobs(jobs)
    with scratch_database("procrastinate", postgres_url) as url:
        asyncio.run(_prepare(url, batch))
        analyze(url)
        commands = [worker_command(concurrency)] * workers
        return drain("procrastinate", batch, commands, {URL_ENV: url}, timeout)
