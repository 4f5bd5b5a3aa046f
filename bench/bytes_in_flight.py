"""What one worker holds in memory when the queue is full of attachments (issue 27):
`python3 -m bench.bytes_in_flight [--messages 45] [--mib 9]`.

`--messages` messages, each with its own `--mib` MiB attachment (distinct bytes: nothing
shared), queued on a scratch PostgreSQL database, drained by one worker process (batch
100, concurrency 256, the sink provider taking half a second a send, so that every claimed
message is held at once). Run with MAX_BYTES_IN_FLIGHT at its default (256 MiB) and with it
out of the way (64 GiB: what every claim did before the bound); the worker's peak resident
memory (VmHWM) in each, and the bytes attached to what was queued. Results:
bench/results/bytes_in_flight.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    Database,
    counts,
    scratch_database,
    start_workers,
    stop_workers,
    wait_until,
    worker_env,
)
from mailbag.domain.content import Attachment
from mailbag.domain.message import new_message
from mailbag.services.outbox import write_many

RESULTS = ROOT / "bench" / "results" / "bytes_in_flight.json"
MIB = 1024 * 1024
UNBOUNDED = 64 * 1024 * MIB


def seed(db: Database, messages: int, mib: int) -> None:
    for i in range(messages):
        data = i.to_bytes(4, "big") * (mib * MIB // 4)
        report = Attachment(f"report-{i}.pdf", "application/pdf", data)
        message = new_message(
            to=f"user{i}@example.com", subject="Your report", text="Attached.", attachments=[report]
        )
        with db.engine.begin() as conn:
            write_many(conn, [message])


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def drain(messages: int, mib: int, bound: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, scratch_database("postgresql", Path(tmp)) as db:
        seed(db, messages, mib)
        settings: dict[str, Any] = {"batch_size": 100, "concurrency": 256, "poll_interval": 0.2}
        if bound is not None:
            settings["max_bytes_in_flight"] = bound
        sink = Path(tmp) / "sink"
        sink.mkdir()
        env = worker_env(db, sink, **settings)
        env["BENCH_SINK_DELAY"] = "0.5"
        (worker,) = start_workers(1, env)
        try:
            started = time.monotonic()
            wait_until(lambda: counts(db).get("sent", 0) == messages, timeout=600, interval=0.2)
            seconds = time.monotonic() - started
            peak = peak_rss_mib(worker.pid)
        finally:
            stop_workers([worker])
    return {
        "max_bytes_in_flight_mib": None if bound is None else bound / MIB,
        "queued_attachment_mib": messages * mib,
        "peak_rss_mib": round(peak, 1),
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=45)
    parser.add_argument("--mib", type=int, default=9)
    args = parser.parse_args()
    runs = [drain(args.messages, args.mib, None), drain(args.messages, args.mib, UNBOUNDED)]
    RESULTS.write_text(json.dumps(runs, indent=2) + "\n")
    for run in runs:
        bound = run["max_bytes_in_flight_mib"]
        label = "default (256 MiB)" if bound is None else f"{bound:.0f} MiB"
        print(
            f"MAX_BYTES_IN_FLIGHT {label}: peak RSS {run['peak_rss_mib']} MiB with "
            f"{run['queued_attachment_mib']} MiB attached in the queue, {run['seconds']} s"
        )


if __name__ == "__main__":
    main()
