"""What the peer benchmarks share: the job body, the result, scratch databases, worker
processes and the drain measurement.

Timing: with `drain`, `seconds` runs from the moment the first worker process is spawned
(so start-up counts) to the last hand-off the sink noted, using the sink's own timestamps;
`drain_idle` (bench/versus.py's PgQueuer) times as mailbag's dispatch benchmark does, from
the COMMIT of the enqueue that idle workers see. `per_second` is distinct handed-off ids /
`seconds`.

The sink keeps notes in memory and writes them at exit or on `flush()`. Job runners may
never reach atexit (Celery's pool children leave with `os._exit`), and the drain is
detected by reading the sink folder, so each worker process flushes every FLUSH_EVERY
seconds from a small thread; a lock makes the flush and `hand_off` exclusive, because
`sink.flush()` clears its list after writing and would drop a note appended meanwhile.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bench import sink
from mailbag.templates import Rendered, builtin

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
# A DB number nothing else on the box uses: the Celery peer flushes it before and after.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"
FLUSH_EVERY = 0.05  # seconds; bounds how late the parent can see the last hand-off
STOP_GRACE = 30.0  # seconds a worker gets to exit after SIGTERM before SIGKILL


@dataclass(frozen=True)
class PeerResult:
    peer: str
    workers: int
    jobs: int
    seconds: float  # first worker spawned -> last hand-off
    per_second: float  # distinct handed-off ids / seconds
    duplicates: int  # hand-offs beyond the first for an id
    missing: int  # enqueued ids never handed off
    startup_seconds: float = 0.0  # first worker spawned -> first hand-off
    cpu_us_per_job: float = 0.0  # the workers' CPU time during the drain, per job (drain_idle)
    # The PostgreSQL server processes' CPU time serving the workers, per job (drain_idle).
    server_cpu_us_per_job: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Job:
    message_id: str
    recipient: str
    name: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def make_jobs(n: int) -> list[Job]:
    # Fresh UUIDs per run, so nothing left over from an earlier run can be counted.
    return [Job(str(uuid.uuid4()), f"user{i}@example.com", f"User {i}") for i in range(n)]


# --- the job body, run inside the peers' worker processes ----------------------------

_lock = threading.Lock()
_flusher_pid: int | None = None
_stopping = False


def render_welcome(name: str) -> Rendered:
    """The email's rendering, done by mailbag's own Catalog (the built-in `welcome`
    template: subject, HTML and text, with Jinja): the same code and cost on both sides
    of a comparison, so that the figures compare the queues and nothing else."""
    return builtin().render("welcome", {"name": name})


def deliver(message_id: str, name: str) -> None:
    """What mailbag's worker does per email in its benchmark: render, hand to the sink."""
    render_welcome(name)
    _ensure_flusher()
    with _lock:
        sink.hand_off(message_id)


def _ensure_flusher() -> None:
    # Started lazily and per pid: a thread does not survive fork (Celery's prefork pool).
    global _flusher_pid
    if _flusher_pid == os.getpid():
        return
    _flusher_pid = os.getpid()
    threading.Thread(target=_flush_forever, name="sink-flusher", daemon=True).start()


def _flush_forever() -> None:
    while True:
        time.sleep(FLUSH_EVERY)
        with _lock:
            if _stopping:
                return
            sink.flush()


def _after_fork_in_child() -> None:
    global _lock, _flusher_pid
    _lock = threading.Lock()  # the parent's may have been held by its flusher mid-fork
    _flusher_pid = None


def final_flush() -> None:
    """Write every note now and stop this process's flusher; for the process's exit."""
    # Registered after bench.sink's own atexit hook, so it runs first; the flusher then
    # stops, and the sink's hook finds nothing left to race with.
    global _stopping
    with _lock:
        _stopping = True
        sink.flush()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(final_flush)


# --- servers ---------------------------------------------------------------------------


def postgres_url() -> str:
    url = (
        os.environ.get("BENCH_POSTGRES_URL")
        or os.environ.get("MAILBAG_TEST_POSTGRES_URL")
        or DEFAULT_POSTGRES_URL
    )
    return plain_postgres_url(url)


def plain_postgres_url(url: str) -> str:
    """`postgresql+psycopg://...` -> `postgresql://...`: the peers pick their own drivers."""
    parts = urlsplit(url)
    if not parts.scheme.startswith("postgres"):
        raise ValueError(f"not a PostgreSQL URL: {url!r}")
    return urlunsplit(parts._replace(scheme="postgresql"))


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def redis_url() -> str:
    return os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS_URL)


def postgres_problem(url: str) -> str | None:
    """Why the server cannot be used, or None when it answers."""
    import psycopg

    try:
        with psycopg.connect(plain_postgres_url(url), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL at {url} not reachable: {exc}"
    return None


def redis_problem(url: str) -> str | None:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
    except Exception as exc:
        return f"Redis at {url} not reachable: {exc}"
    return None


@contextmanager
def scratch_database(peer: str, base_url: str | None = None) -> Iterator[str]:
    """A fresh database `bench_peer_<peer>_...` on the server; dropped afterwards."""
    import psycopg
    from psycopg import sql

    base = plain_postgres_url(base_url) if base_url else postgres_url()
    name = f"bench_peer_{peer}_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(base, name)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            # FORCE: a worker killed mid-query may leave a backend behind for a moment.
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def analyze(url: str) -> None:
    """Planner statistics for the freshly filled queue tables, as autovacuum would have
    gathered them in a running system (without them procrastinate's fetch_job took
    3.5 ms instead of 1.3 ms with 3,000 jobs queued)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")


# --- reading the sink --------------------------------------------------------------------


class SinkFolder:
    """Reads the sink's files incrementally: only bytes appended since the last poll."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.counts: Counter[str] = Counter()
        self._offsets: dict[Path, int] = {}

    def poll(self) -> int:
        """Read what is new; return how many distinct ids have been seen so far."""
        for path in self.folder.glob("*.txt"):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line being written is read next time
            if end == 0:
                continue
            for line in data[:end].decode().splitlines():
                self.counts[line.split()[0]] += 1
            self._offsets[path] = offset + end
        return len(self.counts)


def wait_for_distinct(
    folder: Path,
    n: int,
    timeout: float,
    processes: Sequence[subprocess.Popen[bytes]] = (),
) -> bool:
    """Poll until the sink folder holds n distinct ids; False on timeout.

    Raises if a worker process exits first: it would never finish the drain.
    """
    reader = SinkFolder(folder)
    deadline = time.monotonic() + timeout
    while reader.poll() < n:
        for proc in processes:
            if proc.poll() is not None:
                raise WorkerDied(f"worker pid {proc.pid} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def count_duplicates(ids: Sequence[str]) -> int:
    """Hand-offs beyond the first for the same id."""
    return len(ids) - len(set(ids))


class WorkerDied(RuntimeError):
    pass


# --- worker processes -----------------------------------------------------------------


def worker_env(sink_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # The workers import bench.peers.*, which lives in the repository, not in site-packages.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["BENCH_SINK_DIR"] = str(sink_dir)
    env.update(extra or {})
    return env


def start_workers(
    commands: Sequence[Sequence[str]], env: Mapping[str, str], log_dir: Path
) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i, command in enumerate(commands):
        log = (log_dir / f"worker-{i}.log").open("wb")
        procs.append(
            subprocess.Popen(
                list(command),
                env=dict(env),
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own process group: a worker's children (Celery's pool) can be reached
                # if the worker itself does not stop on SIGTERM.
                start_new_session=True,
            )
        )
        log.close()
    return procs


def stop_workers(procs: Sequence[subprocess.Popen[bytes]], grace: float = STOP_GRACE) -> None:
    """SIGTERM (each peer's graceful stop), then SIGKILL the group of any that linger."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def python_command(*args: str) -> list[str]:
    return [sys.executable, *args]


def drain(
    peer: str,
    jobs: Sequence[Job],
    commands: Sequence[Sequence[str]],
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
    *,
    workers: int | None = None,
) -> PeerResult:
    """Start the workers (already enqueued jobs wait for them), time until every job is
    handed off, stop the workers and count what the sink saw.

    `workers` is the number of job-running processes to report; by default one per
    command (Celery runs one command with W pool processes).
    """
    workdir = Path(tempfile.mkdtemp(prefix=f"bench_peer_{peer}_"))
    sink_dir = workdir / "sink"
    sink_dir.mkdir()
    expected = {job.message_id for job in jobs}
    started = time.time()
    procs = start_workers(commands, worker_env(sink_dir, env), workdir)
    try:
        finished = wait_for_distinct(sink_dir, len(expected), timeout, procs)
    except WorkerDied as exc:
        raise WorkerDied(f"{peer}: {exc}; logs in {workdir}:\n{_log_tail(workdir)}") from exc
    finally:
        # Also on Ctrl-C: the workers run in their own sessions and would not get it.
        stop_workers(procs)  # after this every note is on disk (atexit or the flusher)
    notes = sink.read_all(sink_dir)
    result = tally(peer, workers or len(commands), expected, notes, started)
    if not finished:
        print(
            f"{peer}: timed out after {timeout}s with {result.missing} missing; "
            f"logs kept in {workdir}",
            file=sys.stderr,
        )
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time so far of these processes (Linux /proc; 0 elsewhere)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def postgres_backends(url: str) -> list[int]:
    """The PostgreSQL server processes serving the database of `url` now (this query's own
    left out): on the same machine, their CPU time is the server's share of the work."""
    import psycopg

    with psycopg.connect(plain_postgres_url(url)) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
    return [pid for (pid,) in rows]


def drain_idle(
    peer: str,
    jobs: Sequence[Job],
    commands: Sequence[Sequence[str]],
    enqueue: Callable[[], None],
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
    *,
    startup: float = 3.0,
    database_url: str | None = None,
) -> PeerResult:
    """As mailbag's dispatch benchmark times itself (bench/dispatch.py): start the workers,
    let them come up and wait idle for `startup` seconds, then `enqueue` every job in one
    committed transaction; the clock runs from that commit to the last hand-off.
    `database_url`: the PostgreSQL database the workers use, whose server processes' CPU
    is measured too."""
    workdir = Path(tempfile.mkdtemp(prefix=f"bench_peer_{peer}_"))
    sink_dir = workdir / "sink"
    sink_dir.mkdir()
    expected = {job.message_id for job in jobs}
    procs = start_workers(commands, worker_env(sink_dir, env), workdir)
    try:
        time.sleep(startup)
        servers = postgres_backends(database_url) if database_url else []
        cpu_before = cpu_seconds([p.pid for p in procs])
        server_before = cpu_seconds(servers)
        enqueue()
        committed = time.time()
        finished = wait_for_distinct(sink_dir, len(expected), timeout, procs)
        cpu = cpu_seconds([p.pid for p in procs]) - cpu_before
        server_cpu = cpu_seconds(servers) - server_before
    except WorkerDied as exc:
        raise WorkerDied(f"{peer}: {exc}; logs in {workdir}:\n{_log_tail(workdir)}") from exc
    finally:
        stop_workers(procs)
    result = tally(peer, len(commands), expected, sink.read_all(sink_dir), committed)
    per_job = 1e6 / max(len(expected), 1)
    result = replace(
        result,
        cpu_us_per_job=round(cpu * per_job, 1),
        server_cpu_us_per_job=round(server_cpu * per_job, 1),
    )
    if not finished:
        print(f"{peer}: timed out after {timeout}s; logs kept in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def tally(
    peer: str,
    workers: int,
    expected: set[str],
    notes: Sequence[tuple[str, float]],
    started: float,
) -> PeerResult:
    ids = [message_id for message_id, _ in notes]
    seen = set(ids) & expected
    times = [at for _, at in notes]
    last = max(times) if times else time.time()
    seconds = max(last - started, 1e-9)
    return PeerResult(
        peer=peer,
        workers=workers,
        jobs=len(expected),
        seconds=round(seconds, 3),
        per_second=round(len(seen) / seconds, 1),
        duplicates=count_duplicates(ids),
        missing=len(expected - seen),
        startup_seconds=round(min(times) - started, 3) if times else 0.0,
    )


def _log_tail(workdir: Path, lines: int = 20) -> str:
    tails = []
    for log in sorted(workdir.glob("worker-*.log")):
        text = log.read_text(errors="replace").splitlines()[-lines:]
        tails.append(f"--- {log.name}\n" + "\n".join(text))
    return "\n".join(tails)
