"""mailbag against PgQueuer, the same job in the same run: N welcome emails queued and
committed while the workers wait idle, drained with an instant provider on PostgreSQL,
at one and two worker processes, in interleaved rounds (mailbag first in odd rounds,
PgQueuer first in even ones, so neither always runs on a warmer server).

- mailbag: `bench.dispatch.throughput` (real `mailbag worker` processes with the
  benchmark's `sink` provider and its worker settings, bench.dispatch.WORKER_SETTINGS:
  BATCH_SIZE=100 CONCURRENCY=256 POLL_INTERVAL=0.05), every message rendered from the
  built-in `welcome` template, a history row per transition, claim token and lease.
- PgQueuer: bench/peers/pgqueuer_peer.py (one QueueManager per process on an asyncpg
  connection, `qm.run(batch_size=100)`, max_concurrent_tasks unset, as PgQueuer's own
  benchmark tool runs it; its job renders the same template with Jinja).

Both clocks run from the COMMIT that makes every message visible to the last hand-off
the sink noted; `*_cpu_us` is the worker processes' CPU time over the drain per message,
`*_postgres_cpu_us` the CPU time of the PostgreSQL server processes serving them.
A row per (round, workers): both rates, their ratio (mailbag / PgQueuer), and both
sides' duplicates and missing, which must be 0.
"""

from __future__ import annotations

import os
from typing import Any

from bench import dispatch
from bench.peers import pgqueuer_peer

FULL = {"jobs": 20_000, "rounds": 5, "workers": (1, 2)}
QUICK = {"jobs": 300, "rounds": 1, "workers": (1,)}


def _mailbag(jobs: int, workers: int) -> dict[str, Any]:
    return dispatch.throughput("postgresql", jobs, workers)


def _pgqueuer(jobs: int, workers: int) -> dict[str, Any]:
    url = os.environ.get("BENCH_POSTGRES_URL") or None
    return pgqueuer_peer.run(jobs, workers, postgres_url=url, timeout=600).as_dict()


def run(quick: bool) -> list[dict[str, Any]]:
    size = QUICK if quick else FULL
    jobs, rounds = int(size["jobs"]), int(size["rounds"])  # type: ignore[call-overload]
    rows = []
    for round_ in range(1, rounds + 1):
        for workers in size["workers"]:  # type: ignore[attr-defined]
            sides = [("mailbag", _mailbag), ("pgqueuer", _pgqueuer)]
            if round_ % 2 == 0:
                sides.reverse()
            got = {name: measure(jobs, workers) for name, measure in sides}
            ours, peer = got["mailbag"], got["pgqueuer"]
            rows.append(
                {
                    "database": "postgresql",
                    "messages": jobs,
                    "workers": workers,
                    "round": round_,
                    "first": sides[0][0],
                    "mailbag_per_second": ours["per_second"],
                    "pgqueuer_per_second": peer["per_second"],
                    "ratio": round(ours["per_second"] / max(peer["per_second"], 1e-9), 3),
                    "mailbag_cpu_us": ours["cpu_us_per_message"],
                    "pgqueuer_cpu_us": peer["cpu_us_per_job"],
                    "mailbag_postgres_cpu_us": ours["postgres_cpu_us_per_message"],
                    "pgqueuer_postgres_cpu_us": peer["server_cpu_us_per_job"],
                    "mailbag_duplicates": ours["duplicates"],
                    "mailbag_missing": ours["missing"],
                    "pgqueuer_duplicates": peer["duplicates"],
                    "pgqueuer_missing": peer["missing"],
                }
            )
    return rows


if __name__ == "__main__":
    import json
    import sys

    for row in run("--quick" in sys.argv):
        print(json.dumps(row), flush=True)
