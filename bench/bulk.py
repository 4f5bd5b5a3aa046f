"""`mailbag send-bulk` on 100,000 rows: the whole command, as a user runs it.

    python -m bench.bulk                      # PostgreSQL (BENCH_POSTGRES_URL), 100,000 rows
    python -m bench.bulk --rows 20000 --database sqlite

Makes a scratch database and a CSV of `--rows` rows (to, name, plan), runs
`python -m mailbag send-bulk FILE --template welcome` in a process of its own, and prints
rows per second for the first run and for a second run of the same file (every row
already there: what finishing an interrupted run costs).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import BENCH_SECRET_KEY, ROOT, scratch_database


def make_csv(path: Path, rows: int) -> None:
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["to", "name", "plan"])
        for i in range(rows):
            writer.writerow([f"user{i}@example.com", f"User {i}", "pro" if i % 3 else "free"])


def send_bulk(url: str, path: Path) -> tuple[float, str]:
    env = {
        **os.environ,
        "MAILBAG_DATABASE_URL": url,
        "MAILBAG_SECRET_KEY": BENCH_SECRET_KEY,
        "MAILBAG_LOG_LEVEL": "WARNING",
    }
    command = [sys.executable, "-m", "mailbag", "send-bulk", str(path), "--template", "welcome"]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"send-bulk failed ({done.returncode}): {done.stderr}")
    return seconds, done.stdout.strip()


def run(kind: str, rows: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, scratch_database(kind, Path(tmp)) as db:
        path = Path(tmp) / "recipients.csv"
        make_csv(path, rows)
        first, summary = send_bulk(db.url, path)
        again, summary_again = send_bulk(db.url, path)
    return {
        "database": kind,
        "rows": rows,
        "seconds": round(first, 1),
        "rows_per_second": round(rows / first),
        "rerun_seconds": round(again, 1),
        "rerun_rows_per_second": round(rows / again),
        "summary": summary,
        "rerun_summary": summary_again,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument(
        "--database", choices=("postgresql", "mysql", "sqlite"), default="postgresql"
    )
    args = parser.parse_args()
    result = run(args.database, args.rows)
    print(json.dumps(result, indent=2))
    print(
        f"send-bulk, {args.rows} rows on {args.database}: {result['seconds']} s, "
        f"{result['rows_per_second']} rows/s (whole command); re-run of the same file "
        f"{result['rerun_seconds']} s"
    )


if __name__ == "__main__":
    main()
