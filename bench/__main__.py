"""Run the benchmarks: `python -m bench` (all, full size) or `python -m bench --quick`.

Results go to bench/results/<name>.json and, with plots, to docs/ (see docs/benchmarks.md).
PostgreSQL and MariaDB are taken from BENCH_POSTGRES_URL / BENCH_MYSQL_URL (defaults: the
local servers); each run creates and drops its own scratch databases.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from typing import Any

from bench import brevo_batch, dispatch, enqueue, http_api, latency, rate, scale, smtp_wire, versus
from bench.common import ROOT

# Each of these measures mailbag beside its ceiling or peer in the same run (issue 13).
# `rate`: the fleet's send rate beside the provider's own limit.
PAIRED = {
    "http": http_api,
    "smtp": smtp_wire,
    "versus": versus,
    "brevo": brevo_batch,
    "rate": rate,
}
SECTIONS = (
    "dispatch",
    "ceiling",
    "slow",
    "latency",
    "enqueue",
    "scale",
    "peers",
    *PAIRED,
)


def sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "n": 300,
            "workers": [1, 2],
            "slow": [1, 8],
            "slow_n": 40,
            "rates": [10],
            "latency_seconds": 2,
            "enqueue_n": 100,
            "http_n": 100,
            "rows": [2000],
            "peer_jobs": 100,
        }
    return {
        "n": 20_000,
        "workers": [1, 2, 4],
        "slow": [1, 8, 32, 128],
        "slow_n": 0,
        "rates": [10, 100, 1000],
        "latency_seconds": 10,
        "enqueue_n": 3000,
        "http_n": 3000,
        "rows": [10_000, 100_000, 1_000_000],
        "peer_jobs": 20_000,
    }


def run_sections(
    chosen: list[str],
    databases: list[str],
    quick: bool,
    report: Callable[[str, dict[str, Any]], None],
) -> None:
    size = sizes(quick)
    if "dispatch" in chosen:
        for kind in databases:
            for workers in size["workers"]:
                report("dispatch", dispatch.throughput(kind, size["n"], workers))
        for workers in size["workers"]:
            if "postgresql" in databases:
                report(
                    "dispatch",
                    dispatch.throughput(
                        "postgresql",
                        size["n"] // 2,
                        workers,
                        provider="smtp",
                        concurrency=SMTP_CONCURRENCY,
                    ),
                )
    if "ceiling" in chosen:
        for kind in databases:
            report("ceiling", dispatch.ceiling(kind, size["n"]))
            report("ceiling_worker", dispatch.throughput(kind, size["n"], 1))
    if "slow" in chosen:
        for concurrency in size["slow"]:
            n = size["slow_n"] or max(300, concurrency * 30)
            report(
                "slow",
                {
                    **dispatch.throughput(
                        "postgresql", n, 1, concurrency=concurrency, sink_delay=0.1
                    ),
                    "concurrency": concurrency,
                    "delay_s": 0.1,
                },
            )
    if "latency" in chosen:
        for kind, poll in (("postgresql", 1.0), ("sqlite", 1.0), ("sqlite", 0.05)):
            if kind in databases:
                for rate in size["rates"]:
                    report(
                        "latency",
                        latency.latency(kind, rate, size["latency_seconds"], poll_interval=poll),
                    )
    if "enqueue" in chosen:
        for kind in databases:
            report("enqueue", enqueue.single(kind, size["enqueue_n"]))
            report("enqueue", enqueue.bulk(kind, size["enqueue_n"] * 10))
        for kind in ("postgresql", "sqlite"):
            if kind in databases:
                report("enqueue", enqueue.http(kind, size["http_n"]))
    if "scale" in chosen:
        for kind in ("postgresql", "sqlite"):
            if kind in databases:
                for rows in size["rows"]:
                    report("scale", scale.scale(kind, rows))
    for name, module in PAIRED.items():
        if name in chosen:
            for row in module.run(quick):
                report(name, row)
    if "peers" in chosen:
        from bench.peers.run import PEERS

        for workers in (1,) if quick else (1, 4):
            for peer in PEERS.values():
                row = peer(size["peer_jobs"], workers).as_dict()
                # Like mailbag's figure: from the first hand-off on, start-up left out.
                drain = row["seconds"] - row["startup_seconds"]
                report("peers", {**row, "drain_per_second": round(row["jobs"] / drain)})
            for label, settings in (("mailbag", {}), ("mailbag (defaults)", DEFAULTS)):
                row = dispatch.throughput("postgresql", size["peer_jobs"], workers, **settings)
                report(
                    "peers",
                    {
                        "peer": label,
                        "workers": workers,
                        "jobs": row["messages"],
                        "seconds": row["seconds"],
                        "drain_per_second": row["per_second"],
                        "duplicates": row["duplicates"],
                        "missing": row["missing"],
                    },
                )


# Connections per worker to the one local SMTP server: hundreds of them only queue up at
# its single-threaded accept loop and time out (seen: 30 messages/s with 4 x 256).
SMTP_CONCURRENCY = 16

# mailbag's own defaults (BATCH_SIZE 100, CONCURRENCY 32, POLL_INTERVAL 1 s with NOTIFY).
DEFAULTS = {"batch_size": 100, "concurrency": 32, "poll_interval": 1.0}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--only", nargs="*", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--databases", nargs="*", default=["sqlite", "postgresql", "mysql"])
    parser.add_argument("--name", default="latest", help="results file name")
    args = parser.parse_args()

    results: dict[str, list[dict[str, Any]]] = {}
    out = ROOT / "bench" / "results" / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def report(section: str, row: dict[str, Any]) -> None:
        results.setdefault(section, []).append(row)
        print(section, json.dumps(row), flush=True)
        out.write_text(json.dumps({"machine": machine(), "results": results}, indent=1))

    started = time.time()
    run_sections(args.only, args.databases, args.quick, report)
    print(f"done in {time.time() - started:.0f} s; results in {out.relative_to(ROOT)}")
    if not args.quick:
        from bench import plots

        plots.draw(results, ROOT / "docs")


def machine() -> dict[str, Any]:
    import os

    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }


if __name__ == "__main__":
    main()
