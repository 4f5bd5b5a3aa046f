"""Assemble the long-running parts from settings: engines, provider, catalog, worker.

Entry points (the CLI, `serve`) call these; tests build the same parts directly.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag import providers, templates
from mailbag.services.reconciliation import Reconciler
from mailbag.settings import Settings
from mailbag.store import migrate
from mailbag.store.database import dialect_of, make_async_engine, make_engine
from mailbag.worker import PeriodicJob, Worker, WorkerConfig


class SchemaNotCurrent(RuntimeError):
    pass


def ensure_schema(settings: Settings, *, upgrade: bool) -> None:
    """Migrate (serve, migrate) or insist the schema is current (worker and API replicas,
    which must not race each other to migrate)."""
    engine = make_engine(settings.database_url, null_pool=True)
    try:
        if upgrade:
            migrate.upgrade(engine)
            return
        with engine.connect() as conn:
            if not migrate.is_current(conn):
                raise SchemaNotCurrent(
                    f"the database schema is at {migrate.current_revision(conn)!r}, not "
                    f"{migrate.head_revision()!r}: run `mailbag migrate` first"
                )
    finally:
        engine.dispose()


def worker_engine(settings: Settings) -> AsyncEngine:
    # Claims, finalizes, lease extensions and sweeps overlap: a handful of connections.
    return make_async_engine(
        settings.database_url,
        pool_size=4,
        timeout=settings.database_timeout_seconds,
        statement_timeout=settings.database_timeout_seconds,
    )


def build_worker(settings: Settings, engine: AsyncEngine) -> Worker:
    listen_url = (
        settings.database_url if dialect_of(settings.database_url) == "postgresql" else None
    )
    provider = providers.create(settings.provider, settings)
    reconciler = Reconciler(
        engine,
        dialect_of(settings.database_url),
        provider=provider,
        flag_after=timedelta(minutes=settings.reconcile_flag_after_minutes),
    )
    config = WorkerConfig.from_settings(settings)

    async def reconcile(now: datetime) -> Mapping[str, int]:
        return await reconciler.run_once(now, message_domain=config.message_id_domain)

    return Worker(
        engine=engine,
        provider=provider,
        catalog=templates.load(settings.templates_dir),
        config=config,
        listen_url=listen_url,
        jobs=[PeriodicJob("reconciled", settings.reconcile_every_seconds, reconcile)],
    )


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
    }


def api_server(settings: Settings) -> Any:
    import uvicorn

    return uvicorn.Server(uvicorn.Config(**uvicorn_options(settings), lifespan="on"))


async def run_serve(settings: Settings) -> None:
    """API, console and worker in one process and one event loop."""
    stop = stop_on_signals()
    server = api_server(settings)
    server.install_signal_handlers = lambda: None
    api = asyncio.create_task(server.serve())
    try:
        await run_worker(settings, stop)
    finally:
        server.should_exit = True
        await api


async def run_worker(settings: Settings, stop: asyncio.Event | None = None) -> None:
    stop = stop or stop_on_signals()
    if settings.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port, addr=settings.api_host)
    engine = worker_engine(settings)
    worker = build_worker(settings, engine)
    try:
        await worker.run(stop)
    finally:
        await worker.provider.aclose()
        await engine.dispose()
