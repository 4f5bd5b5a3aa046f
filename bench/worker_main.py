"""A mailbag worker process that can use the benchmarks' `sink` provider.

`python -m bench.worker_main` is `mailbag worker` with bench.sink registered; settings come
from the environment as usual (MAILBAG_PROVIDER=sink)."""

from __future__ import annotations

import asyncio
import os
from typing import Unpack

from sqlalchemy import URL
from sqlalchemy.ext.asyncio import AsyncEngine

import bench.sink  # noqa: F401 - registers the `sink` provider
from mailbag import log, runtime
from mailbag.settings import Settings
from mailbag.store.database import EngineOptions, make_async_engine


def _nothing() -> None:
    pass


def _pinging(url: str | URL, **options: Unpack[EngineOptions]) -> AsyncEngine:
    options["pre_ping"] = True
    return make_async_engine(url, **options)


def main() -> None:
    if os.environ.get("BENCH_DEFAULT_GC"):
        # To measure what runtime.tune_gc saves: the interpreter's default collector.
        setattr(runtime, "tune_gc", _nothing)  # noqa: B010
    if os.environ.get("BENCH_PRE_PING"):
        # To measure what the worker engine saves without pool_pre_ping.
        setattr(runtime, "make_async_engine", _pinging)  # noqa: B010 - not re-exported
    settings = Settings()
    log.configure(settings.log_level)
    asyncio.run(runtime.run_worker(settings))


if __name__ == "__main__":
    main()
