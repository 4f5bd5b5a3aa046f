"""Hook deliveries per second, one worker, to a local receiver answering at once (issue 27):
`python -m bench.hook_throughput`.

A scratch PostgreSQL database, a hook of the `default` tenant subscribed to `sent` pointing
at a receiver on 127.0.0.1 (a process of its own: raw asyncio, HTTP/1.1 keep-alive, 204 at
once, each POST's signature verified, arrivals counted by webhook-id), and `--messages`
pending messages. One real `mailbag worker` process (file provider, HOOKS_KEY set) sends
them, and its hook deliverer delivers their `sent` events. Measured: deliveries per second
from the first delivery row (its created_at, as the database has it) to the last arrival
at the receiver, with every webhook-id arrived exactly once (a run that misses one, or sees
one twice, fails).

Beside it, in the same round, the yardsticks: the receiver's own ceiling (a plain asyncio
client POSTing the same number of requests, as many at once as HOOK_MAX_IN_FLIGHT_PER_
ENDPOINT lets the worker), and an httpx client loop doing the same (the HTTP client the
deliverer uses, alone). Second scenario (`hanging`): the same, with a second tenant whose
endpoint accepts connections and never answers, and `--hanging` messages of its own; its
loss is how much the healthy endpoint's rate drops beside it (target under 10%).

Rounds interleave every measurement (`--rounds`, at least five for the docs); each figure
is reported as its median and range. Results: bench/results/hook_throughput.json.

    python -m bench.hook_throughput --rounds 5
    python -m bench.hook_throughput --messages 200 --rounds 1   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    Database,
    scratch_database,
    stop_workers,
    wait_until,
    worker_env,
)

RESULTS = ROOT / "bench" / "results" / "hook_throughput.json"
HOOKS_KEY = "bench-hooks-key-0123456789abcdef0123456789"
PATH = "/hooks"
# A body and headers of a real delivery's size (a `sent` event's payload is about 300 bytes).
SAMPLE_BODY = json.dumps(
    {
        "type": "message.sent",
        "timestamp": "2025-01-01T00:00:00.000000Z",
        "data": {
            "message_id": "01935f3c-8a2e-7c3b-9d4e-5f6a7b8c9d0e",
            "tenant_id": "default",
            "status": "sent",
            "to": "user1@example.com",
            "template": "welcome",
            "subject": "Welcome, User 1",
            "provider": "file",
            "provider_message_id": "01935f3c-8a2e-7c3b-9d4e-5f6a7b8c9d0e@mailbag",
        },
    },
    separators=(",", ":"),
).encode()
SAMPLE_HEADERS = {
    "webhook-id": "msg_01935f3c8a2e7c3b9d4e5f6a7b8c9d0e",
    "webhook-timestamp": "1735689600",
    "webhook-signature": "v1," + "A" * 44,
    "content-type": "application/json",
    "user-agent": "mailbag-hooks",
}


# --- The receiver: a process of its own ----------------------------------------------------


class _Counts:
    """What the receiver saw since its last reset."""

    def __init__(self) -> None:
        self.reset(None)
        self.hanging = 0  # connections to the hanging port open now

    def reset(self, secret: bytes | None) -> None:
        self.secret = secret
        self.arrivals = 0
        self.ids: dict[str, int] = {}
        self.bad_signatures = 0
        self.first: float | None = None
        self.last: float | None = None

    def arrived(self, headers: dict[str, str], body: bytes) -> None:
        from mailbag.domain.hooks import InvalidSignature, verify

        now = time.time()
        self.first = self.first or now
        self.last = now
        self.arrivals += 1
        webhook_id = headers.get("webhook-id", "")
        self.ids[webhook_id] = self.ids.get(webhook_id, 0) + 1
        if self.secret is not None:
            try:
                verify(self.secret, headers, body)
            except InvalidSignature:
                self.bad_signatures += 1

    def as_json(self) -> dict[str, Any]:
        return {
            "arrivals": self.arrivals,
            "unique": len(self.ids),
            "duplicates": self.arrivals - len(self.ids),
            "bad_signatures": self.bad_signatures,
            "first": self.first,
            "last": self.last,
            "hanging_connections": self.hanging,
        }


class _Healthy(asyncio.Protocol):
    """HTTP/1.1 keep-alive: POST /hooks is counted and answered 204 at once; GET /stats
    answers the counts; POST /reset (body: the endpoint's secret, or empty) resets them."""

    def __init__(self, counts: _Counts) -> None:
        self.counts, self.buffer = counts, bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length") or 0)
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            self.transport.write(self._answer(lines[0], headers, body))

    def _answer(self, request_line: str, headers: dict[str, str], body: bytes) -> bytes:
        method, path, _ = request_line.split(" ", 2)
        if method == "POST" and path == PATH:
            self.counts.arrived(headers, body)
            return b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"
        if method == "POST" and path == "/reset":
            self.counts.reset(body or None)
            return b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"
        text = json.dumps(self.counts.as_json()).encode()
        return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(text), text)


class _Hanging(asyncio.Protocol):
    """Accepts a connection, reads what comes, never answers."""

    def __init__(self, counts: _Counts) -> None:
        self.counts = counts

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.counts.hanging += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.counts.hanging -= 1


async def _serve() -> None:
    loop, counts = asyncio.get_running_loop(), _Counts()
    healthy = await loop.create_server(lambda: _Healthy(counts), "127.0.0.1", 0, backlog=1024)
    hanging = await loop.create_server(lambda: _Hanging(counts), "127.0.0.1", 0, backlog=1024)
    ports = {
        "healthy": healthy.sockets[0].getsockname()[1],
        "hanging": hanging.sockets[0].getsockname()[1],
    }
    print(json.dumps(ports), flush=True)
    await asyncio.Event().wait()  # until the harness kills it


@dataclass
class Receiver:
    process: subprocess.Popen[str]
    healthy: int
    hanging: int

    def __post_init__(self) -> None:
        import httpx

        # One client for the whole run: a new one per question costs the machine more CPU
        # than the receiver spends on the deliveries being measured.
        self.control = httpx.Client(base_url=f"http://127.0.0.1:{self.healthy}", trust_env=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.healthy}{PATH}"

    @property
    def hanging_url(self) -> str:
        return f"http://127.0.0.1:{self.hanging}{PATH}"

    def reset(self, secret: bytes | None = None) -> None:
        self.control.post("/reset", content=secret or b"")

    def stats(self) -> dict[str, Any]:
        return dict(self.control.get("/stats").json())


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    return env


@contextmanager
def receiver() -> Iterator[Receiver]:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.hook_throughput", "--serve"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=_env(),
    )
    try:
        assert process.stdout is not None
        ports = json.loads(process.stdout.readline())
        found = Receiver(process, ports["healthy"], ports["hanging"])
        yield found
        found.control.close()
    finally:
        process.kill()
        process.wait()


# --- The yardsticks: clients POSTing to the receiver ----------------------------------------


async def _raw_client(port: int, n: int, concurrency: int) -> float:
    """N POSTs of a delivery's size, `concurrency` keep-alive connections; seconds taken."""
    head = "".join(f"{k}: {v}\r\n" for k, v in SAMPLE_HEADERS.items())
    request = (
        f"POST {PATH} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n{head}"
        f"content-length: {len(SAMPLE_BODY)}\r\n\r\n"
    ).encode() + SAMPLE_BODY
    left = n

    async def one_connection() -> None:
        nonlocal left
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while left > 0:
            left -= 1
            writer.write(request)
            await reader.readuntil(b"\r\n\r\n")  # a 204: no body
        writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(one_connection() for _ in range(concurrency)))
    return time.perf_counter() - started


async def _httpx_client(port: int, n: int, concurrency: int) -> float:
    import httpx

    left = n
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, trust_env=False) as client:

        async def one_loop() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                answer = await client.post(
                    f"http://127.0.0.1:{port}{PATH}", content=SAMPLE_BODY, headers=SAMPLE_HEADERS
                )
                assert answer.status_code == 204

        started = time.perf_counter()
        await asyncio.gather(*(one_loop() for _ in range(concurrency)))
        return time.perf_counter() - started


def yardstick(kind: str, rx: Receiver, n: int, concurrency: int) -> dict[str, Any]:
    """One client's run in a process of its own, as the worker is; what the receiver saw."""
    rx.reset()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "bench.hook_throughput", f"--client={kind}"),
            *(f"--port={rx.healthy}", f"--messages={n}", f"--concurrency={concurrency}"),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=_env(),
    )
    seconds = float(done.stdout.strip())
    seen = rx.stats()
    if seen["arrivals"] != n:
        raise RuntimeError(f"{kind} client: {seen['arrivals']} of {n} POSTs arrived")
    return {"per_second": n / seconds, "seconds": seconds}


# --- The measured run: one real worker -------------------------------------------------------


def _seed(db: Database, rx: Receiver, healthy: int, hanging: int) -> dict[str, Any]:
    """The hooks (a healthy one for `default`, and for a second tenant a hanging one when
    `hanging`), and the messages, the two tenants' interleaved; the healthy hook's secret."""
    from mailbag.clock import utcnow
    from mailbag.domain.hooks import parse_secret
    from mailbag.domain.message import new_message
    from mailbag.services.hooks import Hooks
    from mailbag.services.tenants import create_tenant
    from mailbag.settings import Settings
    from mailbag.store import enqueue as enqueue_store
    from mailbag.store.database import make_async_engine
    from mailbag.store.plan import run

    settings = Settings(database_url=db.url, hooks_key=HOOKS_KEY, hook_allow_http_localhost=True)
    other = create_tenant(db.engine, "hanging")[0].id if hanging else None

    async def hooks() -> dict[str, Any]:
        engine = make_async_engine(db.url)
        try:
            service = Hooks(engine, settings)
            made = await service.create_endpoint("default", rx.url, ["sent"])
            found = {"healthy": made.endpoint.id, "secret": made.secret}
            if other is not None:
                stuck = await service.create_endpoint(other, rx.hanging_url, ["sent"])
                found["hanging"] = stuck.endpoint.id
            return found
        finally:
            await engine.dispose()

    found = asyncio.run(hooks())
    tenants: list[str] = []
    every = max(1, healthy // hanging) if hanging else 0
    for i in range(healthy):  # the hanging endpoint's events come all along the run
        tenants.append("default")
        if other and i % every == 0 and i // every < hanging:
            tenants.append(other)
    if other:
        tenants += [other] * (hanging - tenants.count(other))
    now = utcnow()
    with db.engine.begin() as conn:
        for start in range(0, len(tenants), 2000):
            batch = [
                new_message(
                    to=f"user{i}@example.com",
                    template="welcome",
                    data={"name": f"User {i}"},
                    tenant_id=tenant,
                )
                for i, tenant in enumerate(tenants[start : start + 2000], start)
            ]
            run(conn, enqueue_store.enqueue(batch, now=now, default_max_attempts=5))
    found["secret_bytes"] = parse_secret(found.pop("secret"))
    return found


def delivery_run(
    rx: Receiver,
    healthy: int,
    hanging: int = 0,
    *,
    src: Path = ROOT / "src",
    timeout: float = 300.0,
    worker_module: Sequence[str] = ("mailbag", "worker"),
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One worker delivering `healthy` events to the healthy receiver (and `hanging` to the
    hanging one, beside it); the healthy endpoint's rate, and what the receiver counted."""
    from sqlalchemy import text

    with tempfile.TemporaryDirectory(prefix="mailbag-hook-throughput-") as tmp:
        folder = Path(tmp)
        with scratch_database("postgresql", folder) as db:
            found = _seed(db, rx, healthy, hanging)
            rx.reset(found["secret_bytes"])
            env = worker_env(
                db,
                folder / "sink",
                provider="file",
                file_dir=folder / "mail",
                hooks_key=HOOKS_KEY,
                hook_allow_http_localhost="true",
            )
            env["PYTHONPATH"] = os.pathsep.join([str(src), str(ROOT)])
            env.update(extra_env or {})
            worker = subprocess.Popen(
                [sys.executable, "-m", *worker_module],
                env=env,
                cwd=folder,
                start_new_session=True,
            )
            try:

                def arrived() -> bool:
                    if worker.poll() is not None:
                        raise RuntimeError(f"the worker exited with {worker.returncode}")
                    return bool(rx.stats()["unique"] >= healthy)

                # The receiver keeps the last arrival's time itself: no need to ask often.
                wait_until(arrived, timeout=timeout, interval=0.1)
                time.sleep(0.2)  # a duplicate would arrive now
                seen = rx.stats()
            finally:
                stop_workers([worker])
            with db.engine.connect() as conn:
                first = conn.execute(
                    text("SELECT min(created_at) FROM hook_deliveries WHERE endpoint_id = :e"),
                    {"e": found["healthy"]},
                ).scalar_one()
                statuses: dict[str, int] = dict(
                    conn.execute(
                        text(
                            "SELECT status, count(*) FROM hook_deliveries "
                            "WHERE endpoint_id = :e GROUP BY status"
                        ),
                        {"e": found["healthy"]},
                    ).all()
                )
    check_counts(seen, healthy)
    started = _epoch(first)
    seconds = seen["last"] - started
    return {
        "per_second": healthy / seconds,
        "seconds": seconds,
        "first_arrival_after": seen["first"] - started,
        "arrivals": seen["arrivals"],
        "duplicates": seen["duplicates"],
        "statuses": statuses,
        "hanging_connections": seen["hanging_connections"],
    }


def check_counts(seen: dict[str, Any], expected: int) -> None:
    """Every delivery arrived exactly once, signed: else the run does not count."""
    problems = []
    if seen["unique"] != expected:
        problems.append(f"{seen['unique']} of {expected} webhook-ids arrived")
    if seen["duplicates"]:
        problems.append(f"{seen['duplicates']} arrived twice")
    if seen["bad_signatures"]:
        problems.append(f"{seen['bad_signatures']} signatures did not verify")
    if problems:
        raise RuntimeError("; ".join(problems))


def _epoch(value: Any) -> float:
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


# --- Where the worker's database time goes --------------------------------------------------


def _counting_worker(out: Path) -> None:
    """`mailbag worker`, counting each statement it runs (calls, rows, seconds, by its
    SQL's first 160 characters) into `out` when it stops: pg_stat_statements' figures,
    from the client's side (the bench may not load the extension into a shared server)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from mailbag import log, runtime
    from mailbag.settings import Settings

    calls: dict[str, list[float]] = {}

    @event.listens_for(Engine, "before_cursor_execute")
    def started(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        conn.info["bench_started"] = time.perf_counter()

    @event.listens_for(Engine, "after_cursor_execute")
    def ended(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        key = " ".join(statement.split())[:160]
        entry = calls.setdefault(key, [0, 0, 0.0])
        entry[0] += 1
        entry[1] += max(cursor.rowcount, 0)
        entry[2] += time.perf_counter() - conn.info.pop("bench_started", time.perf_counter())

    # Batches sent at once (store/pipeline.py) go past SQLAlchemy's events: one entry per
    # batch, its statements' first words, timed from its first byte out to its last in.
    from mailbag.store import pipeline

    send = pipeline._send

    async def counted(pg: Any, dialect: Any, steps: Any, **given: Any) -> Any:
        started = time.perf_counter()
        try:
            return await send(pg, dialect, steps, **given)
        finally:
            key = "at once: " + " | ".join(
                " ".join(pipeline.compiled(step.statement, dialect).sql.split())[:40]
                for step in steps
            )
            entry = calls.setdefault(key, [0, 0, 0.0])
            entry[0] += 1
            entry[2] += time.perf_counter() - started

    pipeline._send = counted
    settings = Settings()
    log.configure(settings.log_level)
    try:
        asyncio.run(runtime.run_worker(settings))
    finally:
        ranked = sorted(calls.items(), key=lambda item: -item[1][2])
        out.write_text(
            json.dumps(
                [{"sql": k, "calls": v[0], "rows": v[1], "seconds": v[2]} for k, v in ranked],
                indent=1,
            )
        )


# --- Rounds ---------------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


@dataclass(frozen=True)
class Variant:
    """One code and settings to measure: `src` (a checkout's src/), MAILBAG_ settings."""

    name: str
    src: Path
    settings: dict[str, str]


def measure(
    *, messages: int, hanging: int, rounds: int, concurrency: int, variants: list[Variant]
) -> dict[str, Any]:
    """Every yardstick and every variant's runs, once a round, interleaved."""
    runs: dict[str, list[dict[str, Any]]] = {"raw": [], "httpx": []}
    with receiver() as rx:
        for round_ in range(rounds):
            runs["raw"].append(yardstick("raw", rx, messages, concurrency))
            runs["httpx"].append(yardstick("httpx", rx, messages, concurrency))
            for variant in variants:
                env = {f"MAILBAG_{k.upper()}": v for k, v in variant.settings.items()}
                scenarios = {"alone": 0, "hanging": hanging} if hanging else {"alone": 0}
                for scenario, stuck in scenarios.items():
                    run = delivery_run(rx, messages, stuck, src=variant.src, extra_env=env)
                    runs.setdefault(f"{variant.name}: {scenario}", []).append(run)
            print(
                f"round {round_ + 1}: "
                + ", ".join(f"{k} {v[-1]['per_second']:.0f}/s" for k, v in runs.items()),
                file=sys.stderr,
            )
    result: dict[str, Any] = {
        "messages": messages,
        "hanging_messages": hanging,
        "rounds": rounds,
        "client_concurrency": concurrency,
        "variants": [{"name": v.name, "src": str(v.src), "settings": v.settings} for v in variants],
    }
    for name, values in runs.items():
        result[name] = {"per_second": spread([v["per_second"] for v in values]), "runs": values}
    ceiling = result["raw"]["per_second"]["median"]
    for variant in variants:
        alone = result[f"{variant.name}: alone"]["per_second"]["median"]
        summary: dict[str, float] = {
            "alone_per_second": alone,
            "of_receiver_ceiling": alone / ceiling,
            "of_httpx_loop": alone / result["httpx"]["per_second"]["median"],
        }
        if hanging:
            beside = result[f"{variant.name}: hanging"]["per_second"]["median"]
            summary["beside_hanging_per_second"] = beside
            summary["loss_beside_hanging"] = 1 - beside / alone
        result[f"{variant.name}: summary"] = summary
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--hanging", type=int, default=200, help="0: no hanging scenario")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--concurrency", type=int, default=4, help="the yardsticks' (HOOK_MAX_IN_FLIGHT...)"
    )
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the code to run")
    parser.add_argument(
        "--before", type=Path, help="another checkout's src/, measured in the same rounds"
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="also measure this code with a setting (HOOK_MAX_IN_FLIGHT_PER_ENDPOINT=32)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", choices=["raw", "httpx"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--counting-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.counting_worker:
        _counting_worker(args.counting_worker)
        return
    if args.serve:
        asyncio.run(_serve())
        return
    if args.client:
        run = _raw_client if args.client == "raw" else _httpx_client
        print(asyncio.run(run(args.port, args.messages, args.concurrency)))
        return
    variants = [Variant("mailbag", args.src.resolve(), {})]
    if args.before:
        variants.append(Variant("before", args.before.resolve(), {}))
    for setting in args.setting:
        name, _, value = setting.partition("=")
        variants.append(Variant(f"mailbag, {name}={value}", args.src.resolve(), {name: value}))
    result = measure(
        messages=args.messages,
        hanging=args.hanging,
        rounds=args.rounds,
        concurrency=args.concurrency,
        variants=variants,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if "summary" in k}, indent=2))


if __name__ == "__main__":
    main()
