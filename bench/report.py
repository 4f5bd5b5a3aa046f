"""Markdown tables from a results file: `python -m bench.report [bench/results/latest.json]`.

docs/benchmarks.md holds these tables (between the markers) beside the discussion.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.common import ROOT

START, END = "<!-- tables:start -->", "<!-- tables:end -->"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def render(results: dict[str, list[dict[str, Any]]], machine: dict[str, Any]) -> str:
    parts = [f"Machine: {machine['cpus']} CPUs, {machine['platform']}, Python {machine['python']}."]
    dispatch = results.get("dispatch", [])
    parts.append("### 1. Dispatch throughput (messages/s; 0 duplicates, 0 missing in every run)")
    parts.append(
        table(
            ["database", "provider", "messages", "workers", "messages/s", "duplicates", "missing"],
            [
                (
                    r["database"],
                    r["provider"],
                    r["messages"],
                    r["workers"],
                    r["per_second"],
                    r["duplicates"],
                    r["missing"],
                )
                for r in dispatch
            ],
        )
    )
    ceiling = {r["database"]: r for r in results.get("ceiling", [])}
    worker = {r["database"]: r for r in results.get("ceiling_worker", [])}
    parts.append("### 2. The ceiling: bare claim + finalize statements, one process")
    parts.append(
        table(
            ["database", "bare SQL loop, messages/s", "one mailbag worker, messages/s", "fraction"],
            [
                (
                    kind,
                    c["per_second"],
                    worker[kind]["per_second"],
                    f"{worker[kind]['per_second'] / c['per_second']:.0%}",
                )
                for kind, c in ceiling.items()
                if kind in worker
            ],
        )
    )
    parts.append("### 3. Slow provider (100 ms per send), one worker process, PostgreSQL")
    parts.append(
        table(
            ["CONCURRENCY", "messages", "messages/s", "ideal (CONCURRENCY x 10/s)"],
            [
                (r["concurrency"], r["messages"], r["per_second"], r["concurrency"] * 10)
                for r in results.get("slow", [])
            ],
        )
    )
    parts.append("### 4. Latency, enqueue commit to provider hand-off (ms)")
    parts.append(
        table(
            [
                "database",
                "wake-up",
                "offered/s",
                "achieved/s",
                "p50",
                "p95",
                "p99",
                "max",
                "p99 from the enqueue call",
            ],
            [
                (
                    r["database"],
                    "NOTIFY" if r["database"] == "postgresql" else f"poll {r['poll_interval']} s",
                    r["offered_per_second"],
                    r["achieved_per_second"],
                    r["p50_ms"],
                    r["p95_ms"],
                    r["p99_ms"],
                    r["max_ms"],
                    r["p99_from_enqueue_call_ms"],
                )
                for r in results.get("latency", [])
            ],
        )
    )
    parts.append("### 5. Enqueue")
    parts.append(
        table(
            ["database", "how", "messages", "per second"],
            [
                (r["database"], r["mode"], r["messages"], r["per_second"])
                for r in results.get("enqueue", [])
            ],
        )
    )
    parts.append("### 6. Scale: 1,000 due rows among N finished ones")
    parts.append(
        table(
            ["database", "rows", "claim of 100, p50 ms", "p95 ms", "worker peak RSS, MiB"],
            [
                (
                    r["database"],
                    f"{r['rows']:,}",
                    r["claim_p50_ms"],
                    r["claim_p95_ms"],
                    r["worker_peak_rss_mib"],
                )
                for r in results.get("scale", [])
            ],
        )
    )
    peers = results.get("peers", [])
    parts.append(
        "### 7. Peers: render a template, hand it to the same sink (PostgreSQL; Celery on Redis)"
    )
    rows = []
    for workers in sorted({r["workers"] for r in peers}):
        same = [r for r in peers if r["workers"] == workers]
        ours = next((r for r in same if r["peer"] == "mailbag"), None)
        for r in same:
            ratio = (
                f"{ours['drain_per_second'] / r['drain_per_second']:.2f}"
                if ours and r is not ours
                else ""
            )
            rows.append(
                (
                    r["peer"],
                    workers,
                    r["jobs"],
                    r["drain_per_second"],
                    ratio,
                    r["duplicates"],
                    r["missing"],
                )
            )
    parts.append(
        table(
            [
                "queue",
                "worker processes",
                "jobs",
                "jobs/s (start-up left out)",
                "mailbag / this",
                "duplicates",
                "missing",
            ],
            rows,
        )
    )
    return "\n\n".join(parts)


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "bench" / "results" / "latest.json"
    data = json.loads(path.read_text())
    tables = render(data["results"], data["machine"])
    doc = ROOT / "docs" / "benchmarks.md"
    text = doc.read_text()
    before, _, rest = text.partition(START)
    _, _, after = rest.partition(END)
    doc.write_text(f"{before}{START}\n{tables}\n{END}{after}")
    print(f"tables from {path} written into {doc}")


if __name__ == "__main__":
    main()
