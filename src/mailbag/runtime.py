"""Assemble the long-running parts from settings: engines, provider, catalog, worker.

Entry points (the CLI, `serve`) call these; tests build the same parts directly.

Every operator command checks the schema through this module, so what only the long-running
parts need (the worker, providers, logging, uvicorn) is imported where they are built.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import hmac
import signal
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from mailbag import keys
from mailbag.store import migrate
from mailbag.store.database import dialect_of, make_async_engine, make_engine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from mailbag.settings import Settings
    from mailbag.worker import Worker


class CannotStart(RuntimeError):
    """Something a command needs is missing or broken; the message says what and what to do."""


class SchemaNotCurrent(CannotStart):
    pass


class ServeFailed(CannotStart):
    pass


def require_key(settings: Settings) -> None:
    """Load the deployment key now, so a missing one stops the process before it serves."""
    try:
        settings.key  # noqa: B018 (a cached property: loading it is the point)
    except keys.MissingSecretKey as exc:
        raise CannotStart(str(exc)) from exc


def require_providers(settings: Settings) -> None:
    """Check every `[providers.NAME]` table now, so a worker never starts half configured."""
    from mailbag.settings import InvalidSettings
    from mailbag.worker import fleet

    try:
        fleet.tables(settings)
    except InvalidSettings as exc:
        raise CannotStart(f"invalid settings: {exc}") from exc


class KeyMismatch(CannotStart):
    pass


KEY_MISMATCH = (
    "the secret key (MAILBAG_SECRET_KEY, or the key file beside an SQLite database) differs "
    "from the key this database was first used with: every API and worker replica needs the "
    "same key, or emailed verification codes never confirm. Start this process with the same "
    "key as the others; if you changed the key on purpose, run `mailbag migrate "
    "--accept-new-key` once (unconfirmed verification codes and console sessions then end)"
)


def key_check(key: bytes) -> str:
    """A value that tells keys apart and says nothing about them (an HMAC under a subkey)."""
    return hmac.new(keys.derive(key, "key-check"), b"mailbag key check v1", "sha256").hexdigest()


def check_key(settings: Settings) -> None:
    """Record the key's check value if the database has none (the first start), then refuse
    to start with any other key: replicas with different keys would each accept only their
    own verification codes and sessions. Call after ensure_schema."""
    from mailbag.clock import utcnow
    from mailbag.store import deployment
    from mailbag.store.session import Database

    expected = key_check(settings.key)
    engine = make_engine(settings.database_url, null_pool=True)
    try:
        db = Database(engine)
        with db.transaction() as tx:  # replicas starting together: the first value stays
            tx.run(deployment.record_key_check(expected, utcnow()))
        with db.connect(read_only=True) as session:
            stored = session.run(deployment.stored_key_check())
    except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
        raise CannotStart(f"cannot use the database {_shown(settings)}: {exc.orig or exc}") from exc
    finally:
        engine.dispose()
    if stored is None or not hmac.compare_digest(stored, expected):
        raise KeyMismatch(KEY_MISMATCH)


def accept_new_key(settings: Settings) -> None:
    """Make the current key the one this database expects (`migrate --accept-new-key`)."""
    from mailbag.clock import utcnow
    from mailbag.store import deployment
    from mailbag.store.session import Database

    engine = make_engine(settings.database_url, null_pool=True)
    try:
        with Database(engine).transaction() as tx:
            tx.run(deployment.replace_key_check(key_check(settings.key), utcnow()))
    except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
        raise CannotStart(f"cannot use the database {_shown(settings)}: {exc.orig or exc}") from exc
    finally:
        engine.dispose()


def _shown(settings: Settings) -> str:
    return make_url(settings.database_url).render_as_string(hide_password=True)


def ensure_schema(settings: Settings, *, upgrade: bool) -> None:
    """Migrate (serve, migrate) or insist the schema is current (every other command, and
    worker and API replicas, which must not race each other to migrate)."""
    if not upgrade:
        _require_sqlite_file(settings.database_url)
    # Migrations take long locks and session state: behind PgBouncer they go direct.
    engine = make_engine(settings.schema_url if upgrade else settings.database_url, null_pool=True)
    try:
        if upgrade:
            migrate.upgrade(engine)
            return
        with engine.connect() as conn:
            if not migrate.is_current(conn):
                current = migrate.current_revision(conn)
                state = (
                    "has no mailbag schema"
                    if current is None
                    else f"schema is at revision {current!r}, not {migrate.HEAD!r}"
                )
                raise SchemaNotCurrent(f"the database {state}: run `mailbag migrate` first")
    except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
        shown = make_url(settings.database_url).render_as_string(hide_password=True)
        raise CannotStart(f"cannot use the database {shown}: {exc.orig or exc}") from exc
    finally:
        engine.dispose()


def _require_sqlite_file(database_url: str) -> None:
    # Opening a missing SQLite file creates an empty one: say where it was looked for instead.
    if dialect_of(database_url) != "sqlite":
        return
    database = make_url(database_url).database
    if database and database != ":memory:" and not Path(database).exists():
        raise SchemaNotCurrent(
            f"there is no database at {Path(database).resolve()}: run `mailbag migrate` first "
            "(or `mailbag serve`, which migrates), in the folder it should live in"
        )


def worker_engine(settings: Settings) -> AsyncEngine:
    # Claims, finalizes, lease extensions and sweeps overlap: a handful of connections.
    # No pre-ping: the worker takes every database error as "wait and retry", so a dead
    # pooled connection costs one failed batch (SQLAlchemy then drops it and the pool's
    # others of its age), not a round trip before every claim and finalize.
    from mailbag.services.erasure import engine_options

    return make_async_engine(
        settings.database_url,
        pool_size=4,
        timeout=settings.database_timeout_seconds,
        statement_timeout=settings.database_timeout_seconds,
        pre_ping=False,
        execution_options=engine_options(settings),
    )


def build_worker(settings: Settings, engine: AsyncEngine) -> Worker:
    from mailbag import templates
    from mailbag.services.reconciliation import Reconciler
    from mailbag.worker import PeriodicJob, Worker, WorkerConfig, fleet, scheduler
    from mailbag.worker.hooks import deliverer
    from mailbag.worker.rate import rate_limit

    listen_url = settings.session_url if dialect_of(settings.database_url) == "postgresql" else None
    providers = fleet.from_settings(settings)
    reconciler = Reconciler(
        engine,
        providers=providers.members,
        flag_after=timedelta(minutes=settings.reconcile_flag_after_minutes),
    )
    config = WorkerConfig.from_settings(settings)

    async def reconcile(now: datetime) -> Mapping[str, int]:
        return await reconciler.run_once(now, message_domain=config.message_id_domain)

    # Reconciliation and housekeeping once across the fleet, on the elected replica.
    jobs = [
        scheduler.elect(
            settings,
            [
                PeriodicJob("reconciled", settings.reconcile_every_seconds, reconcile),
                *scheduler.maintenance_jobs(settings, engine),
            ],
        )
    ]
    hooks = deliverer(settings, engine)
    if hooks is not None:  # HOOKS_KEY set: event hooks are delivered beside the mail
        jobs.append(PeriodicJob("hooks", settings.poll_interval, hooks.run_once, hooks.aclose))
    return Worker(
        engine=engine,
        fleet=providers,
        catalog=templates.load(settings.templates_dir),
        config=config,
        listen_url=listen_url,
        jobs=jobs,
        rate_limit=rate_limit(settings),  # PROVIDER_RATE, shared by the fleet
    )


# Collections of the youngest generation every 50,000 allocations instead of 700: a process
# with thousands of messages in flight allocates that many in a few batches, and each
# default pass (with the gen2 passes they trigger, walking the whole heap) cost the Brevo
# batch worker 40% of its CPU (120 -> 70 us a message). Nearly everything it frees goes by
# reference count; the rare cycle waits a little longer.
GC_THRESHOLDS = (50_000, 50, 100)


def tune_gc() -> None:
    """For a long-running process once it has started: what start-up built (modules,
    templates, engine) is moved out of the collector's sight, and collections are rarer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, for a graceful drain instead of a kill."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def uvicorn_options(settings: Settings, *, workers: int = 1) -> dict[str, Any]:
    """How the API is served; its processes build their app from the environment."""
    return {
        "app": "mailbag.api.app:app_from_environment",
        "factory": True,
        "host": settings.api_host,
        "port": settings.api_port,
        "workers": workers,
        "log_level": "warning",
        "access_log": False,  # mailbag logs each request itself, as JSON
        "http": ConnectionLimits(
            header_timeout_seconds=settings.api_header_timeout_seconds,
            max_header_bytes=settings.api_max_header_bytes,
            max_connections=settings.api_max_connections,
        ),
        "timeout_keep_alive": settings.api_keep_alive_seconds,
    }


@dataclass(frozen=True)
class ConnectionLimits:
    """What each connection to the API may take (api/connection_limits.py applies it), and
    uvicorn's `http=`: called for each new connection, it makes its protocol. It pickles, as
    `api --workers N` sends it to each worker process, and imports the API's modules only
    when the server makes its first protocol: an API that cannot be imported then fails
    inside the server, which says so (_serve_api)."""

    header_timeout_seconds: float
    max_header_bytes: int
    max_connections: int

    def __call__(self, **protocol: Any) -> asyncio.Protocol:
        from mailbag.api.connection_limits import LimitedHttpToolsProtocol

        return LimitedHttpToolsProtocol(**protocol, limits=self)


def api_server(settings: Settings) -> Any:
    import uvicorn

    return uvicorn.Server(uvicorn.Config(**uvicorn_options(settings), lifespan="on"))


async def run_serve(settings: Settings, on_ready: Callable[[str], None] | None = None) -> None:
    """API, console and worker in one process and one event loop.

    The worker starts once the API listens, and `on_ready` is called then with the API's
    URL (never before). If either part cannot start or stops on its own, the other is
    stopped and ServeFailed says why; a signal stops both gracefully.
    """
    stop = stop_on_signals()
    sock = listen(settings)
    server, api = await _start_api(settings, sock)
    if on_ready is not None:
        on_ready(url_of(sock))
    worker = asyncio.create_task(_run_worker_task(settings, stop), name="mailbag worker")
    await asyncio.wait({api, worker}, return_when=asyncio.FIRST_COMPLETED)
    requested = stop.is_set()  # a signal, not a failure, ended the first one
    stop.set()
    server.should_exit = True
    await asyncio.wait({api, worker})
    for part in (worker, api):
        part.result()  # a ServeFailed from either
    if not requested:
        raise ServeFailed("the API server or the worker stopped on its own; both are stopped")


def listen(settings: Settings) -> socket.socket:
    """The API's socket, bound and listening before any part starts; uvicorn serves on it.

    Bound here, not by uvicorn: a port that is taken (or an address this machine does not
    have) is then one error, ServeFailed, said once by the command, before the app is
    built; uvicorn would log it and exit, and the command would say it again."""
    host, port = settings.api_host, settings.api_port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's backlog
    except OSError as exc:
        sock.close()
        why = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            why = "the port is taken (address already in use); choose another with --port"
        raise ServeFailed(f"the API could not start on {host}:{port}: {why}") from None
    sock.set_inheritable(True)  # `api --workers N`: each worker process serves on it
    return sock


def url_of(sock: socket.socket) -> str:
    """The API's base URL on a listening socket (its real port when API_PORT is 0)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


async def _start_api(settings: Settings, sock: socket.socket) -> tuple[Any, asyncio.Task[None]]:
    """uvicorn serving the API on `sock` in this event loop, once it has started (the app
    built, its lifespan run); ServeFailed says why if it could not."""
    server = api_server(settings)
    api = asyncio.create_task(_serve_api(server, settings, sock), name="mailbag api")
    while not server.started:
        if api.done():
            api.result()  # raises ServeFailed with the reason
            raise ServeFailed("the API server stopped while starting")
        await asyncio.sleep(0.02)
    return server, api


def run_api(settings: Settings, *, workers: int, on_ready: Callable[[str], None]) -> None:
    """`mailbag api`: the API alone, until SIGTERM/SIGINT. `on_ready` gets its URL once it
    listens: once started in one process; with several, once the socket listens (a
    connection waits in its backlog until a worker process takes it)."""
    import contextlib

    import uvicorn

    sock = listen(settings)
    if workers > 1:
        from uvicorn.supervisors import Multiprocess

        on_ready(url_of(sock))
        Multiprocess(uvicorn.Config(**uvicorn_options(settings, workers=workers)), [sock]).run()
        return

    async def serve() -> None:
        stop_on_signals()  # uvicorn re-raises the signal that stopped it: caught, exit 0
        _, api = await _start_api(settings, sock)
        on_ready(url_of(sock))
        await api

    loop = uvicorn.Config(**uvicorn_options(settings)).get_loop_factory()  # uvloop if there
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=loop) as runner:
        runner.run(serve())


async def _serve_api(server: Any, settings: Settings, sock: socket.socket) -> None:
    """uvicorn reports a failed start (the app not importable, its lifespan failing) with
    sys.exit(1) after logging it; turn that into an error that names the cause."""
    from mailbag import log

    try:
        await server.serve(sockets=[sock])
    except SystemExit as exc:
        cause = exc.__context__
        reason = f": {cause}" if cause is not None else " (see the log above)"
        raise ServeFailed(
            f"the API could not start on {settings.api_host}:{settings.api_port}{reason}"
        ) from cause
    except Exception as exc:
        log.get("mailbag.serve").error("api failed", exc_info=exc)
        if not server.started:  # e.g. the app cannot be imported: a dependency is missing
            raise ServeFailed(
                f"the API could not start on {settings.api_host}:{settings.api_port}: {exc!r}"
            ) from exc
        raise ServeFailed(f"the API server failed: {exc!r}") from exc


async def _run_worker_task(settings: Settings, stop: asyncio.Event) -> None:
    from mailbag import log

    try:
        await run_worker(settings, stop)
    except Exception as exc:
        log.get("mailbag.serve").error("worker failed", exc_info=exc)
        raise ServeFailed(f"the worker stopped: {exc!r}") from exc


async def run_worker(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Send until `stop` (default: SIGTERM/SIGINT) and drain. With METRICS_PORT, the
    worker's metrics are served there meanwhile, behind METRICS_TOKEN like the API's."""
    from mailbag import metrics_server

    stop = stop or stop_on_signals()
    endpoint = (
        metrics_server.start(settings.api_host, settings.metrics_port, settings.metrics_token)
        if settings.metrics_port is not None
        else None
    )
    try:
        engine = worker_engine(settings)
        worker = build_worker(settings, engine)
        tune_gc()
        try:
            await worker.run(stop)
        finally:
            await worker.fleet.aclose()
            for job in worker.jobs:
                if job.close is not None:
                    await job.close()
            await engine.dispose()
    finally:
        if endpoint is not None:  # scrapes are answered until the drain is done
            await asyncio.to_thread(endpoint.shutdown)
            endpoint.server_close()
