"""One hanging hook receiver beside a healthy one (issue 22): `python3 -m bench.hook_fairness`.

A real `mailbag worker` (file provider, SQLite in a temporary folder, HOOK_TIMEOUT_SECONDS
5) sends `--events` messages of tenant A, whose endpoint accepts connections and never
answers, then one message of tenant B, whose endpoint answers 204 at once. Measured: how
long B's `sent` event waited for its first POST (from the delivery's creation, as the
database has it, to its arrival at B's receiver), and how many connections A's endpoint
had open when it did. Repeated `--runs` times; the spread is reported.

The same CLI commands drive any checkout: `--src /path/to/other/src` runs that code (its
own migrations, tenants, hooks and worker), for the figure before a change. Results:
bench/results/hook_fairness.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.common import BENCH_SECRET_KEY, ROOT

RESULTS = ROOT / "bench" / "results" / "hook_fairness.json"
HOOKS_KEY = "bench-hooks-key-0123456789abcdef0123456789"


class Hanging:
    """Accepts every connection and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return


class Healthy:
    """Answers 204 at once; keeps when each POST arrived (UTC)."""

    def __init__(self) -> None:
        self.arrived: list[datetime] = []
        arrived = self.arrived

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                arrived.append(datetime.now(UTC))
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


def one_run(src: Path, events: int, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mailbag-hook-fairness-") as tmp:
        folder = Path(tmp)
        database = folder / "hooks.db"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAILBAG_")}
        env.update(
            {
                "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)]),
                "MAILBAG_DATABASE_URL": f"sqlite:///{database}",
                "MAILBAG_SECRET_KEY": BENCH_SECRET_KEY,
                "MAILBAG_HOOKS_KEY": HOOKS_KEY,
                "MAILBAG_HOOK_ALLOW_HTTP_LOCALHOST": "true",
                "MAILBAG_HOOK_TIMEOUT_SECONDS": str(timeout),
                "MAILBAG_PROVIDER": "file",
                "MAILBAG_FILE_DIR": str(folder / "mail"),
                "MAILBAG_LOG_LEVEL": "WARNING",
            }
        )

        def mailbag(*args: str) -> str:
            done = subprocess.run(
                [sys.executable, "-m", "mailbag", *args],
                env=env,
                cwd=folder,
                capture_output=True,
                text=True,
                check=True,
            )
            return done.stdout.strip()

        hanging, healthy = Hanging(), Healthy()
        mailbag("migrate")
        mailbag("tenants", "create", "other")
        other = sqlite3.connect(database).execute("SELECT id FROM tenants").fetchone()[0]
        mailbag("hooks", "add", "default", f"http://127.0.0.1:{hanging.port}/h", "--event", "sent")
        mailbag("hooks", "add", other, f"http://127.0.0.1:{healthy.port}/h", "--event", "sent")
        rows = "to,name\n" + "".join(f"a{i}@example.com,A\n" for i in range(events))
        (folder / "a.csv").write_text(rows)
        (folder / "b.csv").write_text("to,name\nb@example.com,B\n")
        mailbag("send-bulk", "a.csv", "--template", "welcome")
        mailbag("send-bulk", "b.csv", "--template", "welcome", "--tenant", other)
        worker = subprocess.Popen(
            [sys.executable, "-m", "mailbag", "worker"],
            env=env,
            cwd=folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10 * timeout + 60
            while not healthy.arrived and time.monotonic() < deadline:
                time.sleep(0.02)
            open_to_hanging = len(hanging.held)
        finally:
            worker.terminate()
            worker.wait(timeout=60)
        created = (
            sqlite3.connect(database)
            .execute("SELECT created_at FROM hook_deliveries WHERE tenant_id = ?", (other,))
            .fetchone()[0]
        )
    first = datetime.fromisoformat(str(created)).replace(tzinfo=UTC)
    waited = (healthy.arrived[0] - first).total_seconds() if healthy.arrived else None
    return {"waited_seconds": waited, "connections_to_hanging": open_to_hanging}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the code to run")
    parser.add_argument("--events", type=int, default=150)
    parser.add_argument("--timeout", type=float, default=5.0, help="HOOK_TIMEOUT_SECONDS")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    runs = [one_run(args.src.resolve(), args.events, args.timeout) for _ in range(args.runs)]
    waits = sorted(r["waited_seconds"] for r in runs if r["waited_seconds"] is not None)
    result = {
        "src": str(args.src),
        "events": args.events,
        "hook_timeout_seconds": args.timeout,
        "runs": runs,
        "waited_min_median_max": [waits[0], waits[len(waits) // 2], waits[-1]] if waits else None,
        "bound_seconds": args.timeout + 2,  # the issue's: HOOK_TIMEOUT + 2 s
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
