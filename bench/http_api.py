"""The HTTP API beside its stack's ceiling, in one run (issue 13).

One `mailbag api` process (as `mailbag api` serves it) and the ceiling app
(bench/ceiling_app.py: FastAPI + pydantic + SQLAlchemy async + psycopg + uvicorn, one
INSERT per request) on the same scratch PostgreSQL database, loaded in interleaved rounds
by wrk with 32 connections; a Lua script gives every request a fresh Idempotency-Key (and,
for verifications, a fresh address: one address has one active verification).

Then the latency at half the maximum rate, open-loop. wrk is closed-loop: a slow answer
holds back the next request, so it hides the queueing a fixed arrival rate meets
(coordinated omission), and wrk2 is not packaged by Debian. So a small asyncio generator
here sends requests at fixed times over plain keep-alive HTTP/1.1 sockets and measures
each latency from the time the request was due. It speaks the HTTP it needs by hand rather
than through httpx: httpx spends about a millisecond of CPU per request, on the same two
cores as the server, which would load the server's machine more than the load it measures.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from statistics import median
from typing import Any

from sqlalchemy import text

from bench.common import BENCH_SECRET_KEY, ROOT, free_port, scratch_database, wait_for_http
from mailbag.services.tenants import create_tenant

CONNECTIONS = 32
MESSAGES = "POST /v1/messages"
VERIFICATIONS = "POST /v1/email-verifications"
VERIFICATIONS_MANY = "POST /v1/email-verifications, 32 tenants"
TENANTS = 32  # the many-tenant verification run: each request names one in turn
CEILING = "ceiling (one INSERT)"

# wrk: one Lua state per thread; `setup` numbers the threads so keys never repeat.
LUA = r"""
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
local n = 0
local prefix
function init(args)
  prefix = args[1] .. "-" .. tostring(tid)
end
function request()
  n = n + 1
  local key = prefix .. "-" .. n
  return wrk.format("POST", PATH, {
    ["Content-Type"] = "application/json",
    ["Authorization"] = AUTHS[(n % #AUTHS) + 1],
    ["Idempotency-Key"] = key,
  }, string.format(BODY, key))
end
"""
BODIES = {
    MESSAGES: (
        "/v1/messages",
        '{"to":"u-%s@example.com","template":"welcome","data":{"name":"Ada"}}',
    ),
    VERIFICATIONS: ("/v1/email-verifications", '{"email":"v-%s@example.com"}'),
    VERIFICATIONS_MANY: ("/v1/email-verifications", '{"email":"w-%s@example.com"}'),
    CEILING: (
        "/v1/messages",
        '{"to":"u-%s@example.com","template":"welcome","data":{"name":"Ada"}}',
    ),
}


def _lua(target: str, api_keys: list[str], folder: Path) -> Path:
    path, body = BODIES[target]
    script = folder / f"{abs(hash(target))}.lua"
    auths = ", ".join(json.dumps("Bearer " + key) for key in api_keys)
    script.write_text(
        f"PATH = {json.dumps(path)}\nAUTHS = {{{auths}}}\nBODY = {json.dumps(body)}\n" + LUA
    )
    return script


def wrk(base: str, script: Path, seconds: float, tag: str) -> dict[str, Any]:
    """One closed-loop wrk run: its rate, errors and latency percentiles."""
    out = subprocess.run(
        [
            "wrk",
            "-t2",
            f"-c{CONNECTIONS}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "-s",
            str(script),
            base,
            "--",
            tag,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    ).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", out)
    return {
        "per_second": round(rate, 1),
        "non_2xx": int(bad.group(1)) if bad else 0,
        "socket_errors": sum(int(g) for g in socket.groups()) if socket else 0,
        "closed_loop_p99_ms": _ms(p99.group(1), p99.group(2)) if p99 else None,
    }


def _ms(value: str, unit: str) -> float:
    return round(float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit], 2)


async def open_loop(
    port: int, target: str, api_key: str, rate: float, seconds: float, tag: str
) -> dict[str, Any]:
    """Requests at fixed times (`rate` a second), each latency counted from when it was due."""
    path, body = BODIES[target]
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    latencies: list[float] = []
    failures = 0
    statuses: dict[int, int] = {}  # the answers other than 201

    async def one(i: int, due: float) -> None:
        nonlocal failures
        key = f"{tag}-{i}"
        payload = (body % key).encode()
        request = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {api_key}\r\n"
            f"Idempotency-Key: {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        reader, writer = idle.pop() if idle else await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request)
            status = int((await reader.readline()).split()[1])
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
            failures += 1
            statuses[0] = statuses.get(0, 0) + 1  # 0: no answer (connection error)
            writer.close()
            return
        latencies.append(time.perf_counter() - due)
        if status != 201:
            failures += 1
            statuses[status] = statuses.get(status, 0) + 1
        idle.append((reader, writer))

    n = max(1, int(rate * seconds))
    started = time.perf_counter()
    tasks = []
    for i in range(n):
        due = started + i / rate
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    for _, writer in idle:
        writer.close()
    latencies.sort()

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 2)

    return {
        "requests": n,
        "failures": failures,
        "failed_statuses": statuses,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": round(latencies[-1] * 1000, 2),
    }


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILBAG_")}
    # This checkout's code, not whichever one the package is installed from.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env.update(extra)
    return env


@contextmanager
def _serving(command: list[str], env: dict[str, str], port: int) -> Iterator[int]:
    server = subprocess.Popen(command, env=env, cwd=ROOT)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/healthz", server, timeout=30)
        yield server.pid
    finally:
        server.terminate()
        server.wait(timeout=30)


def run(quick: bool) -> list[dict[str, Any]]:
    """Every row: each round's rates beside the ceiling's, then the p99 at half the max."""
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed (Debian package `wrk`)")
    kind = os.environ.get("BENCH_HTTP_DATABASE", "postgresql")
    rounds, seconds, warm = (1, 1.0, 1.0) if quick else (5, 10.0, 3.0)
    p99_seconds = 2.0 if quick else 10.0
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, scratch_database(kind, Path(tmp)) as db:
        _, api_key = create_tenant(db.engine, "bench")
        many = [create_tenant(db.engine, f"bench-{i}")[1] for i in range(TENANTS)]
        api_port, ceiling_port = free_port(), free_port()
        api_env = _env(
            {
                "MAILBAG_DATABASE_URL": db.url,
                "MAILBAG_LOG_LEVEL": "WARNING",
                "MAILBAG_SECRET_KEY": BENCH_SECRET_KEY,
                # Every request is a new address; the tenant-wide cap would stop the run.
                "MAILBAG_VERIFICATION_SENDS_PER_TENANT_PER_HOUR": "100000000",
            }
        )
        ceiling_env = _env({"CEILING_DATABASE_URL": db.url})
        python = sys.executable
        with (
            _serving([python, "-m", "mailbag", "api", "--port", str(api_port)], api_env, api_port),
            _serving(
                [python, "-m", "bench.ceiling_app", "--port", str(ceiling_port)],
                ceiling_env,
                ceiling_port,
            ),
        ):
            bases = {
                MESSAGES: f"http://127.0.0.1:{api_port}",
                VERIFICATIONS: f"http://127.0.0.1:{api_port}",
                VERIFICATIONS_MANY: f"http://127.0.0.1:{api_port}",
                CEILING: f"http://127.0.0.1:{ceiling_port}",
            }
            keys = {t: many if t == VERIFICATIONS_MANY else [api_key] for t in bases}
            scripts = {t: _lua(t, keys[t], Path(tmp)) for t in bases}
            for target in bases:
                wrk(bases[target], scripts[target], warm, f"warm{abs(hash(target)) % 1000}")
            measured: dict[str, list[float]] = {t: [] for t in bases}
            order = [CEILING, MESSAGES, VERIFICATIONS, VERIFICATIONS_MANY]
            for r in range(1, rounds + 1):
                figures: dict[str, dict[str, Any]] = {}
                # Interleaved, the order turned each round: drift in the machine's load falls
                # on every target alike.
                for target in order[r - 1 :] + order[: r - 1]:
                    figures[target] = wrk(
                        bases[target], scripts[target], seconds, f"r{r}x{len(figures)}"
                    )
                    measured[target].append(figures[target]["per_second"])
                ceiling = figures[CEILING]
                for target in (MESSAGES, VERIFICATIONS, VERIFICATIONS_MANY):
                    got = figures[target]
                    rows.append(
                        {
                            "endpoint": target,
                            "round": r,
                            "database": kind,
                            "connections": CONNECTIONS,
                            "per_second": got["per_second"],
                            "ceiling_per_second": ceiling["per_second"],
                            "ratio": round(got["per_second"] / ceiling["per_second"], 3),
                            "non_2xx": got["non_2xx"],
                            "socket_errors": got["socket_errors"],
                            "closed_loop_p99_ms": got["closed_loop_p99_ms"],
                            "ceiling_closed_loop_p99_ms": ceiling["closed_loop_p99_ms"],
                        }
                    )
            # p99 at half of mailbag's own max rate (the median of the rounds), open-loop;
            # the ceiling at the same rate for comparison.
            for target, tag in ((MESSAGES, "olm"), (VERIFICATIONS, "olv")):
                rate = max(1.0, median(measured[target]) / 2) if not quick else 20.0
                mine = asyncio.run(open_loop(api_port, target, api_key, rate, p99_seconds, tag))
                peer = asyncio.run(
                    open_loop(ceiling_port, CEILING, api_key, rate, p99_seconds, f"c{tag}")
                )
                rows.append(
                    {
                        "endpoint": f"{target}, open-loop at 50% of max",
                        "database": kind,
                        "rate_per_second": round(rate, 1),
                        "max_per_second": median(measured[target]),
                        **mine,
                        "ceiling_p99_ms": peer["p99_ms"],
                        "ceiling_failures": peer["failures"],
                    }
                )
        with db.engine.connect() as conn:
            # Every request names its own address (from its key): two rows for one address
            # would be a duplicate message.
            duplicates = conn.execute(
                text(
                    "SELECT count(*) - count(DISTINCT to_address) FROM outbox_messages "
                    "WHERE to_address LIKE 'u-%'"
                )
            ).scalar_one()
        for row in rows:
            row["duplicates"] = int(duplicates)
    return rows
