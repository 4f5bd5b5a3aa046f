"""Brevo batch sending: one worker sending through `messageVersions` (1,000 emails a call)
to a Brevo stand-in that answers after 100 ms, beside the stand-in's own limit.

- mailbag: N welcome emails seeded (committed at once) into a scratch PostgreSQL database,
  one `mailbag worker` (provider brevo, BATCH_SIZE 1000, CONCURRENCY 8000: up to eight
  1,000-email calls in flight, so the 100 ms waits overlap and the worker's CPU, not the
  wait, sets the rate) already running and idle. The clock runs from the seeding commit
  to the stand-in's answer to the last call; the worker's CPU time per message is noted,
  and PostgreSQL's (its processes on this host), which shares the same cores.
- ceiling: a bare httpx loop, no database, posting the same calls (1,000 versions of the
  same rendered template, built by the provider's own `batch_payload` and encoded once,
  before the clock) with the same number of calls in flight. That is what the stand-in
  and the HTTP round trip allow at this concurrency: no client can do better through it.

Rounds alternate mailbag, ceiling, mailbag, ... (three of each in full mode). Each row
carries both rates and their ratio; the stand-in (bench/brevo_fake.py) records every email
it took, so duplicates and missing are counted on its side, per round.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    Database,
    counts,
    scratch_database,
    seed,
    stand_in_process,
    start_workers,
    stop_workers,
    wait_until,
    welcome_emails,
    worker_env,
)
from mailbag.providers.brevo import SEND_PATH, batch_payload

API_KEY = "xkeysib-bench-0000000000000000-brevo-fake"
DELAY = 0.1  # seconds the stand-in takes to answer a call, as the issue sets
BATCH = 1000  # Brevo's most message versions in one call
CONCURRENCY = 8000  # emails held by the worker at once: up to eight calls in flight
CALLS_IN_FLIGHT = CONCURRENCY // BATCH
FROM_EMAIL = "bench@example.com"  # the stand-in checks `format: email`, as Brevo does
SETTINGS = {
    "provider": "brevo",
    "brevo_api_key": API_KEY,
    "batch_size": BATCH,
    "concurrency": CONCURRENCY,
    "poll_interval": 0.05,
    "from_email": FROM_EMAIL,
}
STARTUP_SECONDS = 3.0
TARGET = 5000  # emails a second, issue 13's target for one worker


def brevo_fake(delay: float = DELAY) -> Any:
    """The stand-in in its own process; yields its base URL."""
    args = ["--port={port}", f"--api-key={API_KEY}", f"--delay={delay}"]
    return stand_in_process("bench.brevo_fake", args, "/bench/records")


def records(url: str) -> dict[str, Any]:
    result: dict[str, Any] = httpx.get(f"{url}/bench/records", timeout=30).json()
    return result


def taken(url: str) -> int:
    """Emails the stand-in took (or requests it refused) since the last reset."""
    count = httpx.get(f"{url}/bench/count").json()
    return int(count["emails"]) + int(count["refused"])


def reset(url: str) -> None:
    httpx.post(f"{url}/bench/reset").raise_for_status()


def tally(
    url: str, expected: set[str], started: float, aliases: dict[str, str] | None = None
) -> dict[str, Any]:
    """What the stand-in took since the last reset, against the recipients expected. An
    email sent alone is recorded by its X-Mailbag-Message-ID: `aliases` maps it to its To."""
    took = records(url)
    if took["refused"]:
        raise RuntimeError(f"the Brevo stand-in refused requests: {took['refused'][:3]}")
    aliases = aliases or {}
    per_key = Counter(aliases.get(key, key) for key in took["keys"])
    calls = took["calls"]
    seconds = max(answered for _, answered, _, _ in calls) - started
    return {
        "seconds": seconds,
        "per_second": len(expected) / seconds,
        "calls": len(calls),
        "versions_per_call": round(sum(n for _, _, n, _ in calls) / len(calls), 1),
        "kib_per_call": round(sum(size for *_, size in calls) / len(calls) / 1024),
        "duplicates": sum(c - 1 for c in per_key.values() if c > 1),
        "missing": len(expected - per_key.keys()),
        "unexpected": len(per_key.keys() - expected),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds() -> float:
    """CPU time used so far by every PostgreSQL process on this host (0 when the server is
    elsewhere). Other clients' queries count too: a figure for where the cores went."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        if "(postgres)" in text:
            fields = text.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def mailbag_round(db: Database, url: str, n: int, sent_before: int, worker: int) -> dict[str, Any]:
    """Seed N emails to user0..user{N-1} (the stand-in records a version by its To) and
    time the running worker until the stand-in answered the last of them. The worker's CPU
    time over the round says what a message costs it, which the shared machine's noise
    does not blur as it does the rate."""
    reset(url)
    ids = seed(db, n)
    committed = time.time()
    cpu_before, postgres_before = cpu_seconds(worker), postgres_cpu_seconds()
    # Polled on the stand-in, not the database: counting a growing table ten times a
    # second would take the cores the worker and PostgreSQL are measured on.
    wait_until(lambda: taken(url) >= n, timeout=180, interval=0.05)
    # Every one must then be decided `sent`: the stand-in's answer alone is not a send.
    wait_until(lambda: counts(db).get("sent", 0) == sent_before + n, timeout=60, interval=0.2)
    cpu = cpu_seconds(worker) - cpu_before
    postgres = postgres_cpu_seconds() - postgres_before
    to = [f"user{i}@example.com" for i in range(n)]
    aliases = {str(message_id): address for message_id, address in zip(ids, to, strict=True)}
    return {
        **tally(url, set(to), committed, aliases),
        "cpu_us_per_message": cpu / n * 1e6,
        "postgres_cpu_us_per_message": postgres / n * 1e6,
    }


def ceiling_bodies(n: int) -> list[bytes]:
    """N emails rendered from the welcome template as the worker renders them, cut into
    1,000-version calls by the provider's own payload builder, JSON-encoded."""
    return [
        httpx.Request(
            "POST",
            "/",
            json=batch_payload(welcome_emails(start, min(n, start + BATCH), from_email=FROM_EMAIL)),
        ).read()
        for start in range(0, n, BATCH)
    ]


async def _post_all(url: str, bodies: list[bytes]) -> None:
    queue = list(reversed(bodies))
    headers = {"api-key": API_KEY, "content-type": "application/json"}
    limits = httpx.Limits(max_connections=CALLS_IN_FLIGHT)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

        async def loop() -> None:
            while queue:
                response = await client.post(SEND_PATH, content=queue.pop(), headers=headers)
                if response.status_code != 201 or "messageIds" not in response.json():
                    raise RuntimeError(f"the stand-in answered {response.status_code}")

        await asyncio.gather(*(loop() for _ in range(CALLS_IN_FLIGHT)))


def ceiling_round(url: str, n: int, bodies: list[bytes]) -> dict[str, Any]:
    reset(url)
    started = time.time()
    asyncio.run(_post_all(url, bodies))
    return tally(url, {f"user{i}@example.com" for i in range(n)}, started)


def run(quick: bool) -> list[dict[str, Any]]:
    n = 3000 if quick else 40_000
    rounds = 1 if quick else 3
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        scratch_database("postgresql", Path(tmp)) as db,
        brevo_fake() as url,
    ):
        bodies = ceiling_bodies(n)
        env = worker_env(db, Path(tmp), **{**SETTINGS, "brevo_base_url": url})
        workers = start_workers(1, env)
        (worker,) = workers
        try:
            time.sleep(STARTUP_SECONDS)  # imports, migrations check, first idle poll
            for number in range(1, rounds + 1):
                ours = mailbag_round(db, url, n, (number - 1) * n, worker.pid)
                bare = ceiling_round(url, n, bodies)
                rows.append(
                    {
                        "database": db.dialect,
                        "round": number,
                        "messages": n,
                        "delay_s": DELAY,
                        "batch_size": BATCH,
                        "concurrency": CONCURRENCY,
                        "calls_in_flight": CALLS_IN_FLIGHT,
                        "per_second": round(ours["per_second"]),
                        "ceiling_per_second": round(bare["per_second"]),
                        "ratio": round(ours["per_second"] / bare["per_second"], 3),
                        "target_per_second": TARGET,
                        "target_met": ours["per_second"] >= TARGET,
                        "seconds": round(ours["seconds"], 3),
                        "worker_cpu_us_per_message": round(ours["cpu_us_per_message"]),
                        # every PostgreSQL process on the host, other clients included
                        "postgres_cpu_us_per_message": round(ours["postgres_cpu_us_per_message"]),
                        "ceiling_seconds": round(bare["seconds"], 3),
                        "calls": ours["calls"],
                        "versions_per_call": ours["versions_per_call"],
                        "ceiling_versions_per_call": bare["versions_per_call"],
                        "kib_per_call": ours["kib_per_call"],
                        "ceiling_kib_per_call": bare["kib_per_call"],
                        "duplicates": ours["duplicates"],
                        "missing": ours["missing"],
                        "ceiling_duplicates": bare["duplicates"],
                        "ceiling_missing": bare["missing"],
                    }
                )
        finally:
            stop_workers(workers)
    return rows
