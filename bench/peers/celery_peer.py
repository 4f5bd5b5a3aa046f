"""Celery (Redis broker) doing mailbag's benchmark job.

Configuration:
- Broker: Redis, a dedicated DB (`BENCH_REDIS_URL`, default `redis://127.0.0.1:6379/13`),
  FLUSHDB before and after each run. No result backend; the task has
  `ignore_result=True`.
- Enqueue (not timed): `welcome.apply_async(kwargs=...)` per job over one producer
  connection, before the worker starts; kwargs are message_id, recipient and name.
  (Celery has no multi-message publish; `group()` would publish one by one too.)
- Workers: ONE worker node with W pool processes, Celery's normal deployment on a host:
  `python -m celery -A bench.peers.celery_peer worker --pool=prefork --concurrency=W
  --loglevel=WARNING`. The W prefork children run the jobs; the node's main process
  consumes from Redis and feeds them, so W=4 means 5 processes.
  Everything else is Celery's default: prefetch multiplier 4, early acknowledgement
  (acks_late off), mingle, gossip and heartbeats on, the JSON serializer.
  `--loglevel=WARNING` is also its default; it is spelled out to match the other peers.
- Stop: SIGTERM, Celery's warm shutdown; each pool child flushes the sink from
  `worker_process_shutdown` (they exit with `os._exit`, so atexit never runs there).
"""

from __future__ import annotations

import os

import redis
from celery import Celery
from celery.signals import worker_process_shutdown

from bench.peers.common import (
    PeerResult,
    deliver,
    drain,
    final_flush,
    make_jobs,
    python_command,
    redis_url,
)

APP_PATH = "bench.peers.celery_peer"
BROKER_ENV = "BENCH_CELERY_BROKER_URL"

app = Celery("bench_peers", broker=os.environ.get(BROKER_ENV) or redis_url())
app.conf.update(
    task_ignore_result=True,
    result_backend=None,
    # Only silences Celery 5's deprecation warning; retrying at start-up is its default.
    broker_connection_retry_on_startup=True,
)


@app.task(name="welcome", ignore_result=True)
def welcome(message_id: str, recipient: str, name: str) -> None:
    deliver(message_id, name)


@worker_process_shutdown.connect
def _flush_sink(**_: object) -> None:
    # Pool children leave with os._exit, skipping atexit: flush on Celery's own hook.
    final_flush()


def worker_command(concurrency: int) -> list[str]:
    return python_command(
        "-m", "celery", "-A", APP_PATH, "worker", "--pool=prefork",
        f"--concurrency={concurrency}", "--loglevel=WARNING",
    )  # fmt: skip


def run(
    jobs: int,
    workers: int,
    *,
    broker_url: str | None = None,
    timeout: float = 600.0,
) -> PeerResult:
    url = broker_url or redis_url()
    server = redis.Redis.from_url(url)
    server.flushdb()  # leftovers from an interrupted run would be drained as well
    try:
        batch = make_jobs(jobs)
        with app.connection_for_write(url) as connection, connection.Producer() as producer:
            for job in batch:
                welcome.apply_async(kwargs=job.as_dict(), producer=producer)
        return drain(
            "celery", batch, [worker_command(workers)], {BROKER_ENV: url}, timeout,
            workers=workers,
        )  # fmt: skip
    finally:
        server.flushdb()
        server.close()
