"""The long-running commands: `worker`, `api`, and `serve` (both in one process)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from mailbag.cli.invocation import fail, prepare, settings


def worker(
    concurrency: Annotated[
        int | None, typer.Option(metavar="N", help="Sends in flight at once.")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(metavar="N", help="Messages claimed per round.")
    ] = None,
    worker_id: Annotated[
        str | None, typer.Option("--id", metavar="ID", help="Worker id (default host:pid).")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(metavar="PORT", help="Serve Prometheus metrics on this port.")
    ] = None,
) -> None:
    """Send email from the outbox until SIGTERM/SIGINT, then drain and exit 0."""
    config = settings(
        concurrency=concurrency,
        batch_size=batch_size,
        worker_id=worker_id,
        metrics_port=metrics_port,
    )
    import asyncio

    from mailbag import log, runtime
    from mailbag.worker import WorkerFailed

    log.configure(config.log_level)
    check_provider()
    prepare(key=True)
    try:
        asyncio.run(runtime.run_worker(config))
    except WorkerFailed as exc:  # logged with its traceback by the worker
        fail(str(exc), code=1)


HOST = Annotated[
    str | None,
    typer.Option(metavar="ADDRESS", help="Address to listen on (default MAILBAG_API_HOST)."),
]
PORT = Annotated[
    int | None,
    typer.Option(
        metavar="PORT", min=0, max=65535, help="Port to listen on (default MAILBAG_API_PORT)."
    ),
]


def serve(host: HOST = None, port: PORT = None) -> None:
    """Everything in one process: migrate, then run the API and the worker.

    Exits non-zero at once, saying why, if any part cannot start (or later stops on its own).
    """
    import asyncio

    from mailbag import log, runtime

    config = settings(api_host=host, api_port=port)
    log.configure(config.log_level)
    check_provider()
    prepare(upgrade=True, key=True)

    def ready(url: str) -> None:  # only once the API listens
        listening(url)
        if config.provider == "file":
            typer.echo(f"mailbag: emails are written to {config.file_dir.resolve()}", err=True)

    try:
        asyncio.run(runtime.run_serve(config, on_ready=ready))
    except runtime.ServeFailed as exc:
        fail(str(exc), code=1)


def api(
    host: HOST = None,
    port: PORT = None,
    workers: Annotated[int, typer.Option(metavar="N", min=1, help="uvicorn worker processes.")] = 1,
) -> None:
    """Serve the HTTP API (and the console) with uvicorn; /metrics of any of its worker
    processes reports the counters of all of them."""
    from mailbag import log, runtime

    config = settings(api_host=host, api_port=port)
    log.configure(config.log_level)
    prepare(key=True)

    # Worker processes read their settings from the environment, so pass overrides there.
    os.environ["MAILBAG_API_HOST"], os.environ["MAILBAG_API_PORT"] = (
        config.api_host,
        str(config.api_port),
    )
    with shared_metrics(workers):
        try:
            runtime.run_api(config, workers=workers, on_ready=listening)
        except runtime.ServeFailed as exc:
            fail(str(exc), code=1)


def listening(url: str) -> None:
    """One line for each part that listens, once it does: the API, and the console (under
    /admin, served when ADMIN_PASSWORD is set)."""
    typer.echo(f"mailbag: API on {url} (docs at {url}/docs)", err=True)
    if settings().admin_password is not None:
        typer.echo(f"mailbag: console on {url}/admin", err=True)


@contextmanager
def shared_metrics(workers: int) -> Iterator[None]:
    """Several processes: prometheus_client's multiprocess mode, in a directory of this run's
    own, removed when the command ends.

    Each process writes its series to files there and a scrape of any one adds them all up;
    a fresh directory, because files left by an earlier run would be added in too. The
    processes are spawned afterwards and inherit the variable before they import
    mailbag.metrics, which is when prometheus_client reads it."""
    if workers <= 1:
        yield
        return
    directory = tempfile.mkdtemp(prefix="mailbag-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    try:
        yield
    finally:
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        shutil.rmtree(directory, ignore_errors=True)


def check_provider() -> None:
    from mailbag import providers

    if settings().provider not in providers.available():
        fail(
            f"unknown provider {settings().provider!r}; "
            f"available: {', '.join(providers.available())}"
        )
