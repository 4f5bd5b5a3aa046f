"""What every benchmark needs: scratch databases, seeding, worker processes, timing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from mailbag.clock import utcnow
from mailbag.domain.delivery import Decision
from mailbag.domain.message import new_message
from mailbag.domain.states import Action
from mailbag.domain.templates import Pin
from mailbag.store import dispatch, migrate
from mailbag.store import enqueue as enqueue_store
from mailbag.store import messages as message_store
from mailbag.store.database import READ_ONLY, dialect_of, make_engine
from mailbag.store.plan import run, run_async

ROOT = Path(__file__).resolve().parents[1]
# Processes on a database server refuse to start without a deployment key; all share this.
BENCH_SECRET_KEY = "bench-secret-key-not-for-production-0123456789"
PG_BASE = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_BASE = os.environ.get("BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")


@dataclass
class Database:
    url: str
    engine: Engine

    @property
    def dialect(self) -> str:
        return dialect_of(self.url)


@contextmanager
def scratch_database(kind: str, folder: Path) -> Iterator[Database]:
    """A migrated, empty database of a kind, dropped afterwards."""
    if kind == "sqlite":
        url = f"sqlite:///{folder / f'bench-{uuid.uuid4().hex[:6]}.db'}"
        engine = make_engine(url)
        migrate.upgrade(engine)
        try:
            yield Database(url, engine)
        finally:
            engine.dispose()
        return
    base = PG_BASE if kind == "postgresql" else MYSQL_BASE
    name = f"mailbag_bench_{uuid.uuid4().hex[:8]}"
    admin = make_engine(base, null_pool=True)
    with admin.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text(f"CREATE DATABASE {name}"))
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url, pool_size=4)
    migrate.upgrade(engine)
    try:
        yield Database(url, engine)
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            if kind == "postgresql":
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                    )
                )
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()


def seed(db: Database, n: int, *, chunk: int = 2000, pin: Pin | None = None) -> list[uuid.UUID]:
    """N pending messages, enqueued through the real store in large transactions; `pin`:
    the tenant's template version of `welcome` they render with (None: the file one)."""
    ids: list[uuid.UUID] = []
    now = utcnow()
    with db.engine.begin() as conn:
        for start in range(0, n, chunk):
            batch = [
                replace(
                    new_message(
                        to=f"user{i}@example.com", template="welcome", data={"name": f"User {i}"}
                    ),
                    pin=pin,
                )
                for i in range(start, min(n, start + chunk))
            ]
            results = run(
                conn,
                enqueue_store.enqueue(
                    batch,
                    now=now,  # type: ignore[arg-type]
                    default_max_attempts=5,
                ),
            )
            ids += [r.message.id for r in results]
    return ids


def counts(db: Database) -> dict[str, int]:
    with db.engine.connect().execution_options(**READ_ONLY) as conn:
        return run(conn, message_store.count_by_status())


def worker_env(db: Database, sink_dir: Path, **settings: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILBAG_")}
    env.update(
        {
            "MAILBAG_DATABASE_URL": db.url,
            "MAILBAG_PROVIDER": "sink",
            "MAILBAG_LOG_LEVEL": "WARNING",
            "MAILBAG_SECRET_KEY": BENCH_SECRET_KEY,
            "BENCH_SINK_DIR": str(sink_dir),
            # This checkout's code, not whichever one the package is installed from.
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        }
    )
    env.update({f"MAILBAG_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def start_workers(
    count: int, env: Mapping[str, str], module: str = "bench.worker_main"
) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [sys.executable, "-m", module], env=dict(env), cwd=ROOT, start_new_session=True
        )
        for _ in range(count)
    ]


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)


def wait_until(condition: Any, timeout: float, interval: float = 0.05) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(interval)
    raise TimeoutError("benchmark did not finish in time")


async def claim_batch(engine: Any, db: Database, worker: str, limit: int) -> Any:
    """One claim, with the statement the worker uses."""
    async with engine.begin() as conn:
        return await run_async(
            conn,
            dispatch.claim(
                worker_id=worker,
                now=utcnow(),  # type: ignore[arg-type]
                lease=timedelta(minutes=5),
                limit=limit,
            ),
        )


async def finalize_all(engine: Any, db: Database, claim: Any, action: Action) -> None:
    """Finalize a whole claim one way (sent, released ...), as the worker's finalize does."""
    decisions = {m.id: Decision(action, provider_message_id="x") for m in claim.messages}
    async with engine.begin() as conn:
        await run_async(
            conn,
            dispatch.finalize(
                token=claim.token,
                decisions=decisions,
                now=utcnow(),
                actor="bench",
                provider="bench",
            ),
        )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def wait_for_http(url: str, server: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Until a GET of `url` answers 200; fails at once when the server process exits."""

    def up() -> bool:
        if server.poll() is not None:
            raise RuntimeError(f"{server.args} exited with {server.returncode}")
        try:
            return httpx.get(url).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(up, timeout=timeout, interval=0.1)


@contextmanager
def stand_in_process(module: str, args: list[str], ready_path: str) -> Iterator[str]:
    """A benchmark's stand-in server (`python -m module *args`, `{port}` in an argument
    replaced by a free port) in a process of its own, so its CPU is never the measured
    process's; yields its base URL once `ready_path` answers."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", module, *(arg.format(port=port) for arg in args)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{url}{ready_path}", process, timeout=20)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)


def welcome_emails(
    start: int, stop: int, *, from_email: str, tags: tuple[str, ...] = ()
) -> list[Any]:
    """The welcome emails to user{start}..user{stop-1}@example.com, each rendered with its
    name as the worker composes them (OutgoingEmail)."""
    from mailbag.compose import OutgoingEmail, rfc_message_id
    from mailbag.domain.content import Address, Recipients
    from mailbag.templates import builtin

    catalog = builtin()
    emails = []
    for i in range(start, stop):
        rendered = catalog.render("welcome", {"name": f"User {i}"})
        message_id = uuid.uuid4()
        emails.append(
            OutgoingEmail(
                message_id=message_id,
                attempt=1,
                tenant_id="default",
                from_email=from_email,
                from_name="mailbag",
                recipients=Recipients(to=(Address(f"user{i}@example.com"),)),
                subject=rendered.subject,
                html=rendered.html,
                text=rendered.text,
                rfc_message_id=rfc_message_id(message_id, "example.com"),
                date=utcnow(),
                tags=list(tags),
            )
        )
    return emails
