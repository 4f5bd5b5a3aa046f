"""A tenant's template in the database beside the file template (issue 26):
`python3 -m bench.db_templates [--database postgresql] [--runs 3] [--n 20000]`.

The same messages (`welcome`, one To, a name) drained by one worker process with the sink
provider (dispatch.drain), rendered once with the built-in file template and once with a
tenant's version of it published in the database, the same text, pinned at enqueue. The
worker reads a version the first time it claims a message that names it and compiles it
once, in the sandbox (templates/book.py): after that both cost one render. Each run drains
both, in alternating order; messages a second and worker CPU per message, their median
and range, and the ratio database/file of each run. Results:
bench/results/db_templates.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import ROOT, Database, scratch_database
from bench.dispatch import drain
from mailbag.domain.templates import Pin
from mailbag.services.templates import Templates
from mailbag.store.database import make_async_engine
from mailbag.templates import BUILTIN_DIR

RESULTS = ROOT / "bench" / "results" / "db_templates.json"


async def _publish_welcome(db: Database) -> Pin:
    """The built-in `welcome`, published as the default tenant's own version 1."""
    folder = BUILTIN_DIR / "welcome"
    fields = {
        "subject": (folder / "subject.txt").read_text(),
        "html": (folder / "body.html").read_text(),
        "text": (folder / "body.txt").read_text(),
        "sample_data": {"name": "Ada"},
    }
    engine = make_async_engine(db.url, pool_size=1)
    try:
        done = await Templates(engine).publish(
            tenant="default", name="welcome", locale="en", fields=fields, changed_by="bench"
        )
    finally:
        await engine.dispose()
    return Pin(done.version.id, done.version.version, done.version.locale)


def one(kind: str, source: str, n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, scratch_database(kind, Path(tmp)) as db:
        pin = asyncio.run(_publish_welcome(db)) if source == "database" else None
        result = drain(db, n, 1, Path(tmp), pin=pin)
    assert result["duplicates"] == 0 and result["missing"] == 0, result
    return {"source": source, **result}


def run(kind: str, n: int, runs: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for i in range(runs):
        order = ("file", "database") if i % 2 == 0 else ("database", "file")
        measured = {source: one(kind, source, n) for source in order}
        rows.append(
            {
                **{f"{s}_per_second": m["per_second"] for s, m in measured.items()},
                **{f"{s}_cpu_us": m["cpu_us_per_message"] for s, m in measured.items()},
                "rate_ratio": measured["database"]["per_second"] / measured["file"]["per_second"],
                "cpu_ratio": measured["database"]["cpu_us_per_message"]
                / measured["file"]["cpu_us_per_message"],
            }
        )
    summary: dict[str, Any] = {"database": kind, "n": n, "runs": rows}
    for name in ("file_per_second", "database_per_second", "file_cpu_us", "database_cpu_us"):
        values = [r[name] for r in rows]
        summary[name] = {"median": statistics.median(values), "range": [min(values), max(values)]}
    for name in ("rate_ratio", "cpu_ratio"):
        values = [r[name] for r in rows]
        summary[name] = {
            "median": round(statistics.median(values), 3),
            "range": [round(min(values), 3), round(max(values), 3)],
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", default="postgresql", choices=("postgresql", "sqlite"))
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    summary = run(args.database, args.n, args.runs)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    for source in ("file", "database"):
        rate, cpu = summary[f"{source}_per_second"], summary[f"{source}_cpu_us"]
        print(
            f"{source}: {rate['median']} messages/s ({rate['range'][0]}-{rate['range'][1]}), "
            f"{cpu['median']} µs CPU a message ({cpu['range'][0]}-{cpu['range'][1]})"
        )
    for name in ("rate_ratio", "cpu_ratio"):
        part = summary[name]
        print(f"{name} database/file: {part['median']} ({part['range'][0]}-{part['range'][1]})")


if __name__ == "__main__":
    main()
