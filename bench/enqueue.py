"""How fast messages get into the outbox: one per transaction, in bulk, and over HTTP."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import BENCH_SECRET_KEY, ROOT, free_port, scratch_database, wait_for_http
from mailbag.domain.message import new_message
from mailbag.services.intake import enqueue
from mailbag.services.outbox import write_many
from mailbag.services.tenants import create_tenant


def single(kind: str, n: int) -> dict[str, Any]:
    """One enqueue per transaction, sequentially (an application's request path)."""
    with tempfile.TemporaryDirectory() as tmp, scratch_database(kind, Path(tmp)) as db:
        started = time.perf_counter()
        for i in range(n):
            with db.engine.begin() as conn:
                enqueue(conn, to=f"user{i}@example.com", template="welcome", data={"name": "Ada"})
        seconds = time.perf_counter() - started
    return {
        "database": kind,
        "mode": "one per transaction",
        "messages": n,
        "per_second": round(n / seconds),
    }


def bulk(kind: str, n: int, chunk: int = 1000) -> dict[str, Any]:
    """write_many, `chunk` messages per call and transaction."""
    with tempfile.TemporaryDirectory() as tmp, scratch_database(kind, Path(tmp)) as db:
        batches = [
            [
                new_message(to=f"user{i}@example.com", template="welcome", data={"name": "Ada"})
                for i in range(start, start + chunk)
            ]
            for start in range(0, n, chunk)
        ]
        started = time.perf_counter()
        for batch in batches:
            with db.engine.begin() as conn:
                write_many(conn, batch)
        seconds = time.perf_counter() - started
    return {
        "database": kind,
        "mode": f"bulk, {chunk} per call",
        "messages": n,
        "per_second": round(n / seconds),
    }


async def _hammer(base: str, key: str, n: int, parallel: int, round_: str) -> float:
    limits = httpx.Limits(max_connections=parallel)
    headers = {"Authorization": f"Bearer {key}"}
    body = {"to": "ada@example.com", "template": "welcome", "data": {"name": "Ada"}}
    async with httpx.AsyncClient(
        base_url=base, limits=limits, headers=headers, timeout=60
    ) as client:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(n):
            queue.put_nowait(i)

        async def one_client() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                reply = await client.post(
                    "/v1/messages", json=body, headers={"Idempotency-Key": f"k-{i}"}
                )
                assert reply.status_code == 201, reply.text

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(parallel)))
        return time.perf_counter() - started


def http(kind: str, n: int, parallel: int = 32) -> dict[str, Any]:
    """POST /v1/messages (with an Idempotency-Key) through one uvicorn worker process."""
    with tempfile.TemporaryDirectory() as tmp, scratch_database(kind, Path(tmp)) as db:
        _, key = create_tenant(db.engine, "bench")
        port = free_port()
        env = {
            "MAILBAG_DATABASE_URL": db.url,
            "MAILBAG_LOG_LEVEL": "WARNING",
            "MAILBAG_SECRET_KEY": BENCH_SECRET_KEY,
            # This checkout's code, not whichever one the package is installed from.
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            "PATH": "/usr/bin:/bin",
        }
        server = subprocess.Popen(
            [sys.executable, "-m", "mailbag", "api", "--port", str(port)], env=env, cwd=ROOT
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for_http(f"{base}/healthz", server, timeout=20)
            asyncio.run(_hammer(base, key, min(200, n), parallel, "warm-up"))
            seconds = asyncio.run(_hammer(base, key, n, parallel, "measured"))
        finally:
            server.terminate()
            server.wait()
    return {
        "database": kind,
        "mode": f"POST /v1/messages, 1 uvicorn worker, {parallel} clients",
        "messages": n,
        "per_second": round(n / seconds),
    }
