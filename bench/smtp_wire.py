"""The SMTP path against the wire's limit: mailbag workers delivering welcome emails into
postfix's `smtp-sink`, beside postfix's `smtp-source` pushing as many messages of the same
size into the same sink, in the same run, round after round (mailbag, smtp-source, ...).

- The sink is a C server that dumps every transaction to one file (`-D`, in /dev/shm);
  both sides pay that cost (smtp-source reaches about half its rate without a dump).
  Every mailbag message carries X-Mailbag-Message-ID, so the dump says which messages
  arrived and how often: duplicates and missing are counted from it, and the database
  must say `sent` for every one.
- mailbag's clock starts when the seeding transaction commits (workers already running and
  idle) and stops when the database counts all N as sent (polled every 20 ms).
- smtp-source runs 16 sessions (`-s 16`), each reusing its connection (`-d`) as mailbag's
  pool does, with a payload of the mean size of the mailbag messages of the same round
  (`-l`, plus its own few headers: the peer never carries less). Its clock is its process.

    flock /work/notes/bench.lock python -m bench --only smtp
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from statistics import median
from typing import Any

from bench.common import (
    PG_BASE,
    Database,
    counts,
    free_port,
    scratch_database,
    seed,
    start_workers,
    stop_workers,
    wait_until,
    worker_env,
)

SINK = shutil.which("smtp-sink") or "/usr/sbin/smtp-sink"
SOURCE = shutil.which("smtp-source") or "/usr/sbin/smtp-source"
SESSIONS = 16
STARTUP_SECONDS = 3.0
# 64 sends in flight per worker: enough to keep a pipelined pool busy; four workers stay
# well under the sink's connection cap (-m) below.
CONCURRENCY = 64
WORKER_SETTINGS = {"batch_size": 100, "concurrency": CONCURRENCY, "poll_interval": 0.05}
_MAILBAG_ID = re.compile(rb"(?mi)^X-Mailbag-Message-ID:\s*(\S+)")
_DUMP_START = re.compile(rb"(?m)^X-Client-Addr: ")
_SINK_HEADERS_END = re.compile(rb"(?m)^Received: from .*\n\t.*\n\t.*\n")


def available() -> str | None:
    """Why this section cannot run here, or None."""
    for tool in (SINK, SOURCE):
        if not os.access(tool, os.X_OK):
            return f"{tool} is not installed (Debian package `postfix`)"
    return None


@contextmanager
def smtp_sink(folder: Path) -> Iterator[tuple[int, Path, subprocess.Popen[bytes]]]:
    """A fresh smtp-sink on a free port, dumping every transaction to one file: in memory
    (/dev/shm) where there is one, since a disk's latency would measure the disk."""
    memory = Path("/dev/shm")
    where = Path(tempfile.mkdtemp(dir=memory if memory.is_dir() else folder))
    # The sink drops to an unprivileged user when run as root: it must reach the folder.
    where.chmod(0o777)
    dump = where / "dump"
    port = free_port()
    command = [SINK, "-D", str(dump), "-m", "2000"]
    if os.geteuid() == 0:
        command += ["-u", "nobody"]
    sink = subprocess.Popen([*command, f"127.0.0.1:{port}", "1000"])
    try:
        wait_until(lambda: _accepts(port), timeout=10)
        yield port, dump, sink
        if sink.poll() is not None:
            raise RuntimeError(f"smtp-sink exited early ({sink.returncode})")
    finally:
        sink.terminate()
        sink.wait()
        shutil.rmtree(where, ignore_errors=True)


def _database_kind() -> str:
    """PostgreSQL (as the issue measured) when its server answers, else SQLite."""
    from sqlalchemy import text

    from mailbag.store.database import make_engine

    try:
        engine = make_engine(PG_BASE, null_pool=True)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception:
        return "sqlite"
    return "postgresql"


def _accepts(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _dumped(dump: Path) -> bytes:
    return dump.read_bytes() if dump.exists() else b""


def _message_sizes(data: bytes) -> list[int]:
    """The size of each dumped message as the client sent it (the sink's headers off)."""
    starts = [m.start() for m in _DUMP_START.finditer(data)] + [len(data)]
    sizes = []
    for begin, end in itertools.pairwise(starts):
        headers_end = _SINK_HEADERS_END.search(data, begin, end)
        body_start = headers_end.end() if headers_end else begin
        sizes.append(end - body_start - 1)  # the sink's blank line after each message
    return sizes


def mailbag_round(db: Database, n: int, workers: int, folder: Path) -> dict[str, Any]:
    """W workers (started idle) drain N new welcome emails into a fresh sink."""
    before = counts(db).get("sent", 0)
    with smtp_sink(folder / "sink") as (port, dump, sink):
        settings = {
            **WORKER_SETTINGS,
            "provider": "smtp",
            "smtp_host": "127.0.0.1",
            "smtp_port": port,
            "smtp_tls": "none",
        }
        env = worker_env(db, folder, **settings)
        processes = start_workers(workers, env)
        try:
            time.sleep(STARTUP_SECONDS)  # imports, the first idle poll
            ids = {str(i) for i in seed(db, n)}
            committed = time.perf_counter()
            wait_until(lambda: _done(db, before + n, sink, *processes), 600, interval=0.02)
            seconds = time.perf_counter() - committed
        finally:
            stop_workers(processes)
        data = _dumped(dump)
    arrived = Counter(m.decode() for m in _MAILBAG_ID.findall(data))
    sizes = _message_sizes(data)
    return {
        "seconds": seconds,
        "per_second": n / seconds,
        "duplicates": sum(c - 1 for c in arrived.values() if c > 1),
        "missing": len(ids - arrived.keys()),
        "message_bytes": round(sum(sizes) / len(sizes)) if sizes else 0,
    }


def _done(db: Database, sent: int, *processes: Any) -> bool:
    dead = [p.args for p in processes if p.poll() is not None]
    if dead:
        raise RuntimeError(f"exited during the round: {dead}")
    return counts(db).get("sent", 0) >= sent


def provider_round(n: int, folder: Path) -> dict[str, Any]:
    """The SMTP provider alone, in this process: N welcome emails (rendered once, MIME
    built per message as the worker does) sent with 64 in flight into a fresh sink. What
    mailbag's SMTP path can do without the database; its CPU time per message too."""
    import asyncio
    import uuid

    from mailbag.clock import utcnow
    from mailbag.compose import OutgoingEmail, rfc_message_id
    from mailbag.domain.content import Address, Recipients
    from mailbag.domain.delivery import Accepted
    from mailbag.providers.smtp import SMTPProvider
    from mailbag.templates import load

    rendered = load(None).render("welcome", {"name": "User"}, None)
    emails = []
    for i in range(n):
        message_id = uuid.uuid4()
        emails.append(
            OutgoingEmail(
                message_id=message_id,
                attempt=1,
                tenant_id="default",
                from_email="mailbag@example.com",
                from_name="mailbag",
                recipients=Recipients(to=(Address(f"user{i}@example.com", f"User {i}"),)),
                subject=rendered.subject,
                html=rendered.html,
                text=rendered.text,
                rfc_message_id=rfc_message_id(message_id, "example.com"),
                date=utcnow(),
            )
        )

    async def send_all(port: int) -> int:
        provider = SMTPProvider(
            host="127.0.0.1", port=port, tls="none", max_connections=CONCURRENCY
        )
        try:
            outcomes = await asyncio.gather(*(provider.send(email) for email in emails))
        finally:
            await provider.aclose()
        return sum(isinstance(outcome, Accepted) for outcome in outcomes)

    with smtp_sink(folder / "sink") as (port, dump, _):
        cpu, started = time.process_time(), time.perf_counter()
        accepted = asyncio.run(send_all(port))
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        arrived = Counter(m.decode() for m in _MAILBAG_ID.findall(_dumped(dump)))
    return {
        "per_second": n / seconds,
        "cpu_us_per_message": cpu / n * 1e6,
        "duplicates": sum(c - 1 for c in arrived.values() if c > 1),
        "missing": n - len(arrived) + (n - accepted),
    }


def source_round(n: int, size: int, folder: Path) -> dict[str, Any]:
    """smtp-source: N messages of SIZE bytes, 16 sessions, into a fresh sink."""
    with smtp_sink(folder / "sink") as (port, dump, _):
        started = time.perf_counter()
        subprocess.run(
            [SOURCE, "-s", str(SESSIONS), "-m", str(n), "-l", str(size), "-d",
             f"127.0.0.1:{port}"],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        seconds = time.perf_counter() - started
        arrived = len(_DUMP_START.findall(_dumped(dump)))
    return {"seconds": seconds, "per_second": n / seconds, "arrived": arrived}


def run(quick: bool) -> list[dict[str, Any]]:
    """Rows: per round and worker count, mailbag's rate beside smtp-source's, and their
    ratio; then one summary row per worker count (median and range of the ratio)."""
    reason = available()
    if reason:
        print(f"smtp: skipped, {reason}")
        return []
    n = 150 if quick else 5000
    rounds = 1 if quick else 3
    worker_counts = [1] if quick else [1, 2, 4]
    # The issue measured on PostgreSQL; a quick run (CI, a laptop) may fall back to SQLite.
    kind = os.environ.get("BENCH_SMTP_DATABASE") or (_database_kind() if quick else "postgresql")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, scratch_database(kind, Path(tmp)) as db:
        for workers in worker_counts:
            for round_number in range(1, rounds + 1):
                folder = Path(tmp) / f"w{workers}-r{round_number}"
                mailbag = mailbag_round(db, n, workers, folder / "mailbag")
                size = max(mailbag["message_bytes"], 1)
                source = source_round(n, size, folder / "source")
                alone = provider_round(n, folder / "provider") if workers == 1 else None
                rows.append(
                    {
                        "database": db.dialect,
                        "workers": workers,
                        "round": round_number,
                        "messages": n,
                        "message_bytes": size,
                        "mailbag_per_second": round(mailbag["per_second"]),
                        "smtp_source_per_second": round(source["per_second"]),
                        "ratio": round(mailbag["per_second"] / source["per_second"], 4),
                        "smtp_source_sessions": SESSIONS,
                        "duplicates": mailbag["duplicates"],
                        "missing": mailbag["missing"],
                        "smtp_source_missing": n - source["arrived"],
                    }
                )
                if alone is not None:  # the SMTP path without the database, same round
                    rows[-1].update(
                        provider_alone_per_second=round(alone["per_second"]),
                        provider_alone_ratio=round(alone["per_second"] / source["per_second"], 4),
                        provider_alone_cpu_us=round(alone["cpu_us_per_message"]),
                        provider_alone_duplicates=alone["duplicates"],
                        provider_alone_missing=alone["missing"],
                    )
            mine = [r for r in rows if r["workers"] == workers and "round" in r]
            rows.append(
                {
                    "database": db.dialect,
                    "workers": workers,
                    "summary": True,
                    "rounds": len(mine),
                    "mailbag_per_second": median(r["mailbag_per_second"] for r in mine),
                    "mailbag_range": [
                        min(r["mailbag_per_second"] for r in mine),
                        max(r["mailbag_per_second"] for r in mine),
                    ],
                    "smtp_source_per_second": median(r["smtp_source_per_second"] for r in mine),
                    "ratio": median(r["ratio"] for r in mine),
                    "ratio_range": [min(r["ratio"] for r in mine), max(r["ratio"] for r in mine)],
                    "duplicates": sum(r["duplicates"] for r in mine),
                    "missing": sum(r["missing"] for r in mine),
                }
            )
    return rows
