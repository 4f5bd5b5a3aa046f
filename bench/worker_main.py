"""A mailbag worker process that can use the benchmarks' `sink` provider.

`python -m bench.worker_main` is `mailbag worker` with bench.sink registered; settings come
from the environment as usual (MAILBAG_PROVIDER=sink)."""

from __future__ import annotations

import asyncio
import os

import bench.sink  # noqa: F401 - registers the `sink` provider
from mailbag import log, runtime
from mailbag.settings import Settings


def main() -> None:
    if os.environ.get("BENCH_DEFAULT_GC"):
        # To measure what runtime.tune_gc saves: the interpreter's default collector.
        runtime.tune_gc = lambda: None
    settings = Settings()
    log.configure(settings.log_level)
    asyncio.run(runtime.run_worker(settings))


if __name__ == "__main__":
    main()
