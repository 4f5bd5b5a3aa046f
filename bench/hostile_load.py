"""What hostile clients cost the API (issue 22): `python3 -m bench.hostile_load`.

One `mailbag api` process (one worker: the process measured is the one serving) on SQLite
in a temporary folder, with mailbag's default API_* limits unless `--set` says otherwise.

- Memory: its RSS (VmRSS, /proc/PID/status) before, at its peak while 16 clients at once
  each POST /v1/messages a 21 MiB body without a key (sampled every 50 ms), and 2 s after.
  Each client sends its whole body without waiting for an answer, as a careless or hostile
  one would, then reads what comes back.
- Keyed: 6 clients at once POST a message at the limits (a 10 MiB attachment, ~13.4 MiB of
  JSON) with a key: the answers (201, or 503 past API_BODY_BYTES_IN_FLIGHT) and the RSS peak.
- Slow and idle connections, at the same time: how long the server keeps each open (at most
  `--hold` seconds): a header line every 2 s; a declared body trickled a byte every 2 s; a
  connection that sends nothing; a kept-alive connection idle after one request.

`--src` runs the server from another checkout's src/ (the figures before a change).
Results: bench/results/hostile_load.json.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import BENCH_SECRET_KEY, ROOT, free_port, rss_kib, wait_for_http
from bench.scale import PeakRss

RESULTS = ROOT / "bench" / "results" / "hostile_load.json"
MIB = 1024 * 1024


@contextmanager
def api_process(
    folder: Path, settings: dict[str, str], src: Path
) -> Iterator[tuple[int, int, str]]:
    """`mailbag api` on a fresh SQLite database: (pid, port, a tenant's API key). The
    database is made by the same source's `migrate` and `tenants create`."""
    url = f"sqlite:///{folder / 'hostile.db'}"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILBAG_")}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)]),
            "MAILBAG_DATABASE_URL": url,
            "MAILBAG_SECRET_KEY": BENCH_SECRET_KEY,
            "MAILBAG_LOG_LEVEL": "WARNING",
            **{f"MAILBAG_{k.upper()}": v for k, v in settings.items()},
        }
    )
    mailbag = [sys.executable, "-m", "mailbag"]
    subprocess.run([*mailbag, "migrate"], env=env, cwd=folder, check=True, capture_output=True)
    key = subprocess.run(
        [*mailbag, "tenants", "create", "bench"],
        env=env,
        cwd=folder,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    server = subprocess.Popen(
        [*mailbag, "api", "--port", str(port)], env=env, cwd=folder, stdout=subprocess.DEVNULL
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/healthz", server, timeout=60)
        yield server.pid, port, key
    finally:
        server.terminate()
        server.wait(timeout=30)


def post(port: int, body: bytes, key: str | None = None) -> str:
    """One POST /v1/messages whose whole body is sent before the answer is read; what
    came back: its status, or how the connection ended."""
    head = [
        "POST /v1/messages HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    if key is not None:
        head.append(f"Authorization: Bearer {key}")
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sent_whole = True
        try:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
            for start in range(0, len(body), MIB):
                sock.sendall(body[start : start + MIB])
        except OSError:
            sent_whole = False  # the server closed the connection: it read no more
        try:
            status = sock.recv(64).split(b" ", 2)[1].decode()
        except (OSError, IndexError):
            return "no answer"
    return status if sent_whole else f"{status}, body cut off"


def at_once(count: int, one: Callable[[], str]) -> dict[str, int]:
    """`count` calls of `one` in threads at once: how many ended each way."""
    ended: list[str] = []
    threads = [threading.Thread(target=lambda: ended.append(one())) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {outcome: ended.count(outcome) for outcome in sorted(set(ended))}


def memory(
    pid: int, count: int, run: Callable[[], dict[str, int]], settle: float
) -> dict[str, Any]:
    before = rss_kib(pid)
    started = time.monotonic()
    with PeakRss(pid) as peak:
        outcomes = run()
    seconds = time.monotonic() - started
    time.sleep(settle)
    after = rss_kib(pid)
    return {
        "clients": count,
        "answers": outcomes,
        "seconds": round(seconds, 2),
        "rss_before_mib": round(before / 1024, 1),
        "rss_peak_mib": peak.mib,
        "rss_after_mib": round(after / 1024, 1),
        "growth_mib": round(peak.peak_kib / 1024 - before / 1024, 1),
    }


def message_at_the_limits() -> bytes:
    content = bytes(range(256)) * (10 * MIB // 256 - 64)  # 10 MiB less the bodies' room
    message = {
        "to": "ada@example.com",
        "subject": "The report",
        "html": "<p>hi</p>",
        "attachments": [{"filename": "big.bin", "content": base64.b64encode(content).decode()}],
    }
    return json.dumps(message).encode()


def held_open(port: int, behaviour: str, hold: float, every: float, key: str) -> dict[str, Any]:
    """How long the server keeps one connection open while the client behaves so."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    answer = b""
    started = time.monotonic()

    def step(data: bytes | None) -> bool:
        """Send `data` (if any), then wait `every`: has the server closed?"""
        nonlocal answer
        if data:
            sock.sendall(data)
        sock.settimeout(every)
        try:
            got = sock.recv(4096)
        except TimeoutError:
            return False
        answer += got
        return not got

    try:
        if behaviour == "header line every 2 s":
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            while time.monotonic() - started < hold and not step(b"X-Slow: 1\r\n"):
                pass
        elif behaviour == "body byte every 2 s":
            sock.sendall(
                b"POST /v1/email-verifications HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000\r\n"
                + f"Authorization: Bearer {key}\r\n\r\n".encode()
            )
            while time.monotonic() - started < hold and not step(b" "):
                pass
        else:
            if behaviour == "kept alive, idle":
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                sock.recv(4096)  # the answer; then nothing more is sent
                started = time.monotonic()
            while time.monotonic() - started < hold and not step(None):
                pass
        closed = time.monotonic() - started < hold
    except OSError:
        closed = True
    finally:
        sock.close()
    status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/1.1") else None
    return {
        "connection": behaviour,
        "open_seconds": round(time.monotonic() - started, 1),
        "closed_by_server": closed,
        "answer": status,
    }


SLOW = ("header line every 2 s", "body byte every 2 s", "sends nothing", "kept alive, idle")


def run(
    *,
    clients: int = 16,
    body_mib: float = 21,
    keyed: int = 6,
    hold: float = 60,
    every: float = 2,
    settle: float = 2,
    settings: dict[str, str] | None = None,
    src: Path = ROOT / "src",
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        api_process(Path(tmp), settings or {}, src) as (
            pid,
            port,
            key,
        ),
    ):
        anonymous = b" " * int(body_mib * MIB)
        summary: dict[str, Any] = {
            "unauthenticated": memory(
                pid, clients, lambda: at_once(clients, lambda: post(port, anonymous)), settle
            )
        }
        if keyed:
            limits = message_at_the_limits()
            summary["keyed_at_the_limits"] = memory(
                pid, keyed, lambda: at_once(keyed, lambda: post(port, limits, key)), settle
            )
        slow: list[dict[str, Any]] = []
        threads = [
            threading.Thread(
                target=lambda b=behaviour: slow.append(held_open(port, b, hold, every, key))
            )
            for behaviour in SLOW
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        summary["slow_connections"] = sorted(slow, key=lambda r: SLOW.index(r["connection"]))
    summary["settings"] = settings or {}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--body-mib", type=float, default=21)
    parser.add_argument("--keyed", type=int, default=6, help="keyed clients; 0: none")
    parser.add_argument("--hold", type=float, default=60, help="longest a slow client waits")
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a MAILBAG_ setting"
    )
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the server's source")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.set)
    summary = run(
        clients=args.clients,
        body_mib=args.body_mib,
        keyed=args.keyed,
        hold=args.hold,
        settings=settings,
        src=args.src,
    )
    print(json.dumps(summary, indent=2))
    args.results.parent.mkdir(exist_ok=True)
    args.results.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
