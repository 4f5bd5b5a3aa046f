"""Hooks keep flowing, and reach only where they may: the deliverer against real receivers
(HTTP and TLS), a real DNS server on loopback, hanging and failing endpoints, and URLs
stored before the rule existed; on each database."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import trustme
from sqlalchemy import select

from mailbag.domain import hooks as rules
from mailbag.domain.delivery import Decision
from mailbag.domain.hooks import Breaker, DAction, DState, HookEndpoint, SecretBox
from mailbag.domain.hooks.urls import Policy
from mailbag.domain.ids import uuid7
from mailbag.domain.states import Action
from mailbag.resolver import DnsResolver, nameservers
from mailbag.store import hooks as store
from mailbag.store.plan import run
from mailbag.store.schema import hook_deliveries, hook_delivery_events, hook_endpoints
from mailbag.worker import hook_http
from mailbag.worker.hooks import HookConfig, HookDeliverer

from conftest import TestDB
from dns_server import DnsServer
from helpers import T0, claim, enqueue, finalize
from hook_receiver import HookReceiver

HOOKS_KEY = "hooks-key-for-flow-tests-0123456789abcdef"
BOX = SecretBox(HOOKS_KEY)
PUBLIC = Policy()
DEVELOPMENT = Policy(allow_loopback=True)  # the receivers here listen on 127.0.0.1


@pytest.fixture(autouse=True)
def fan_out_on(request: pytest.FixtureRequest) -> Iterator[None]:
    """The tests' own writes fan out as a worker with HOOK_MAX_ATTEMPTS=5 would."""
    if "db" not in request.fixturenames:
        yield
        return
    with request.getfixturevalue("db").fanning_out(store.FanOut(max_attempts=5)):
        yield


def add_endpoint(db: TestDB, url: str, tenant: str = "default", secret: str | None = None) -> Any:
    """An endpoint row as the store keeps it, whatever the URL: rows written before the
    rule existed (or under a looser one) are exactly this."""
    now = T0
    endpoint = HookEndpoint(
        id=uuid7(),
        tenant_id=tenant,
        url=url,
        events=frozenset({rules.HookEvent.SENT}),
        enabled=True,
        description=None,
        created_at=now,
        updated_at=now,
    )
    with db.engine.begin() as conn:
        run(conn, store.create_endpoint(endpoint, BOX.seal(secret or rules.new_secret())))
    return endpoint


def sent(db: TestDB, n: int = 1, tenant: str = "default", **fields: Any) -> list[Any]:
    """n of the tenant's messages sent by a worker: each fans out to its endpoints."""
    messages = enqueue(db, n, tenant_id=tenant, **fields)
    token = claim(db, limit=n).token
    finalize(
        db, token, *((m.id, Decision(Action.MARK_SENT, provider_message_id="p")) for m in messages)
    )
    return messages


def rows(db: TestDB, endpoint_id: uuid.UUID | None = None) -> list[Any]:
    query = select(hook_deliveries).order_by(hook_deliveries.c.id)
    if endpoint_id is not None:
        query = query.where(hook_deliveries.c.endpoint_id == endpoint_id)
    with db.engine.connect() as conn:
        return list(conn.execute(query).all())


def deliverer(
    async_engine: Any,
    *,
    destinations: Policy = DEVELOPMENT,
    dns: DnsServer | None = None,
    verify: ssl.SSLContext | bool = True,
    **config: Any,
) -> HookDeliverer:
    resolver = DnsResolver(nameservers(dns.nameservers), timeout=2) if dns else None
    guard = hook_http.Guard(destinations, resolver)
    settings = HookConfig(
        worker_id="w1",
        timeout=config.pop("timeout", 3.0),
        destinations=destinations,
        every=config.pop("every", 0.05),
        **config,
    )
    client = hook_http.HookClient(guard, connections=50, verify=verify)
    # The deliveries' clock stands still: a retry's full jitter may be a few milliseconds,
    # and a retry due again within the same round would make the counts a matter of luck.
    return HookDeliverer(async_engine, BOX, settings, client=client, clock=lambda: T0)


async def deliver(deliverer_: HookDeliverer) -> dict[str, int]:
    try:
        return dict(await deliverer_.run_once())
    finally:
        await deliverer_.aclose()


class Listener:
    """A TCP port on 127.0.0.1 that accepts connections, reads, and never answers (a hanging
    receiver), counting what connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.accepted = 0
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.held.append(conn)

    def __enter__(self) -> Listener:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


# --- nothing accepted can stop delivery -----------------------------------------------------


async def test_urls_stored_before_the_rule_fail_their_own_deliveries_and_nothing_else(
    db, async_engine
):
    # Each of these once made httpx raise at send time, which killed the hook task, the
    # worker and `serve`, on every restart; or reached an internal address.
    legacy = [
        "https://0177.0.0.1:9/hook",
        "https://256.1.1.1/",
        "https://xn--a.example/",
        "https://☃.example/",
        "https://169.254.169.254/latest/meta-data/",
        "https://10.0.0.1/",
        "https://2130706433/",
    ]
    bad = [add_endpoint(db, url) for url in legacy]
    with HookReceiver() as receiver:
        good = add_endpoint(db, receiver.url)
        receiver.secret = _secret_of(db, good.id)
        sent(db, 2)
        outcome = await deliver(deliverer(async_engine))
    assert outcome == {"hooks_delivered": 2, "hooks_retrying": 2 * len(bad)}
    assert len(receiver.ids()) == 2
    for endpoint in bad:
        for row in rows(db, endpoint.id):
            assert (row.status, row.attempts, row.last_status_code) == ("retrying", 1, None)
            assert row.last_error.startswith("forbidden: the URL "), row.last_error


def _secret_of(db: TestDB, endpoint_id: uuid.UUID) -> str:
    with db.engine.connect() as conn:
        sealed = conn.execute(
            select(hook_endpoints.c.secret).where(hook_endpoints.c.id == endpoint_id)
        ).scalar_one()
    return BOX.open(sealed)


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "failure",
    [
        RuntimeError("a bug"),
        UnicodeError("idna"),
        KeyError("k"),
        ssl.SSLError(1, "boom"),
        MemoryError(),
        ValueError("v"),
    ],
    ids=lambda exc: type(exc).__name__,
)
async def test_a_delivery_whose_post_raises_anything_fails_alone_with_its_attempt_spent(
    db, async_engine, failure
):
    from prometheus_client import REGISTRY

    class Raising:  # the deliverer's client, raising at send time
        async def post(self, to: Any, body: bytes, headers: Any) -> int:
            raise failure

        async def aclose(self) -> None:
            pass

    add_endpoint(db, "https://hooks.example.com/h")
    sent(db, 3)
    before = REGISTRY.get_sample_value("mailbag_side_task_failures_total", {"task": "hooks"}) or 0
    deliverer_ = HookDeliverer(
        async_engine,
        BOX,
        HookConfig(worker_id="w1", timeout=2.0),
        client=Raising(),
        clock=lambda: T0,
    )
    assert await deliver(deliverer_) == {"hooks_retrying": 3}
    errors = {row.last_error for row in rows(db)}
    assert {row.attempts for row in rows(db)} == {1}
    (error,) = errors
    assert error.partition(":")[0] in {r.value for r in hook_http.Reason}
    after = REGISTRY.get_sample_value("mailbag_side_task_failures_total", {"task": "hooks"}) or 0
    if error.startswith("internal"):  # a bug of ours is counted as the part's failure
        assert after - before == 3


# --- where a connection may go --------------------------------------------------------------


@pytest.mark.parametrize(
    ("answers", "problem"),
    [
        (["127.0.0.1"], "a loopback address"),
        (["::1"], "a loopback address"),
        (["8.8.8.8", "127.0.0.1"], "a loopback address"),  # one bad address is enough
        (["::ffff:127.0.0.1"], "a loopback address (as IPv6)"),
        (["169.254.169.254"], "a cloud metadata address"),
        (["10.0.0.9"], "a private-network address"),
    ],
)
async def test_a_name_that_resolves_to_an_internal_address_is_never_connected_to(
    db, async_engine, answers, problem
):
    # DNS rebinding: the name passed the rule when it was registered; at send time it
    # points inside. Nothing connects: the listener on 127.0.0.1 sees no one.
    with Listener() as listener, DnsServer() as dns:
        url = f"https://hooks.rebound.example.com:{listener.port}/h"
        rules.check_url(url, PUBLIC)  # registered as a public receiver
        add_endpoint(db, url)
        dns.records["hooks.rebound.example.com"] = answers
        sent(db, 1)
        assert await deliver(deliverer(async_engine, destinations=PUBLIC, dns=dns)) == {
            "hooks_retrying": 1
        }
        assert listener.accepted == 0
        assert dns.queries["hooks.rebound.example.com"] >= 1  # asked at send time
    (row,) = rows(db)
    assert row.last_error == f"forbidden: hooks.rebound.example.com resolves to {problem}"


async def test_a_name_that_does_not_resolve_fails_with_dns(db, async_engine):
    with DnsServer() as dns:
        add_endpoint(db, "https://nowhere.example.com/h")
        sent(db, 1)
        await deliver(deliverer(async_engine, destinations=PUBLIC, dns=dns))
    (row,) = rows(db)
    assert row.last_error == "dns: nowhere.example.com does not resolve"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def tls_server(ca: trustme.CA, *names: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(*names).configure_cert(context)
    return context


def trusting(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


async def test_a_receiver_named_by_dns_is_reached_at_the_checked_address_with_its_name(
    db, async_engine, ca
):
    # The connection goes to the address the guard checked; the Host header, SNI and the
    # certificate's name are still the URL's host.
    with (
        DnsServer() as dns,
        HookReceiver(
            tls=tls_server(ca, "receiver.example.com"), host="receiver.example.com"
        ) as receiver,
    ):
        dns.records["receiver.example.com"] = ["127.0.0.1"]
        endpoint = add_endpoint(db, receiver.url)
        receiver.secret = _secret_of(db, endpoint.id)
        sent(db, 2)
        outcome = await deliver(deliverer(async_engine, dns=dns, verify=trusting(ca)))
    assert outcome == {"hooks_delivered": 2}
    port = receiver.server.server_address[1]
    assert set(receiver.hosts) == {f"receiver.example.com:{port}"}
    assert set(receiver.server_names) == {"receiver.example.com"}


async def test_a_certificate_for_another_name_is_refused_as_tls(db, async_engine, ca):
    with (
        DnsServer() as dns,
        HookReceiver(
            tls=tls_server(ca, "other.example.com"), host="receiver.example.com"
        ) as receiver,
    ):
        dns.records["receiver.example.com"] = ["127.0.0.1"]
        add_endpoint(db, receiver.url)
        sent(db, 1)
        await deliver(deliverer(async_engine, dns=dns, verify=trusting(ca)))
        assert receiver.received == []
    (row,) = rows(db)
    assert row.last_error.startswith("tls: certificate not accepted: Hostname mismatch")


# --- what a failure records -----------------------------------------------------------------


async def test_a_receivers_answer_is_never_stored_nor_logged(db, async_engine, capsys, caplog):
    # An internal service's answer once came back in last_error, the console and the API;
    # and httpx logged every URL (with a receiver's own token in its query).
    secret_body = b"root:x:0:0:SECRET-FROM-AN-INTERNAL-SERVICE"
    with HookReceiver(
        fail_first=10, fail_status=500, answer_body=secret_body, path="/hooks?token=SECRET-TOKEN"
    ) as receiver:
        endpoint = add_endpoint(db, receiver.url)
        receiver.secret = _secret_of(db, endpoint.id)
        sent(db, 1)
        assert await deliver(deliverer(async_engine)) == {"hooks_retrying": 1}
    (row,) = rows(db)
    assert (row.last_error, row.last_status_code) == ("http-5xx: HTTP 500", 500)
    with db.engine.connect() as conn:
        details = conn.execute(select(hook_delivery_events.c.detail)).scalars().all()
    logged = capsys.readouterr()
    assert receiver.received  # the POST was made, and answered
    for text in (*details, logged.out, logged.err, caplog.text):
        assert "SECRET-FROM" not in (text or "") and "SECRET-TOKEN" not in (text or "")


async def test_a_redirect_is_recorded_as_one_and_never_followed(db, async_engine):
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse, RedirectResponse
    from starlette.routing import Route

    from servers import uvicorn_thread

    async def moved(request: Any) -> Any:
        return RedirectResponse("http://169.254.169.254/", status_code=307)

    async def healthz(request: Any) -> Any:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/hooks", moved, methods=["POST"]), Route("/healthz", healthz)])
    with uvicorn_thread(app) as base:
        add_endpoint(db, f"{base}/hooks")
        sent(db, 1)
        await deliver(deliverer(async_engine))
    (row,) = rows(db)
    assert row.last_error == "redirect: HTTP 307 (redirects are not followed)"


# --- fairness between endpoints -------------------------------------------------------------


def claim_hooks(db: TestDB, *, now: Any = T0, limit: int = 50, fairness: Any = None) -> Any:
    with db.engine.begin() as conn:
        return run(
            conn,
            store.claim(
                worker_id="w1",
                now=now,
                lease=timedelta(minutes=1),
                limit=limit,
                fairness=fairness or store.Fairness(in_flight=4),
            ),
        )


def settle(
    db: TestDB, claimed: Any, action: DAction, *, now: Any = T0, breaker: Breaker = Breaker()
) -> Any:
    results = [
        store.Attempted(
            c.delivery.id,
            action,
            status_code=204 if action is DAction.DELIVER else 503,
            error=None if action is DAction.DELIVER else "http-5xx: HTTP 503",
            next_attempt_at=now if action is DAction.RETRY else None,
        )
        for c in claimed.deliveries
    ]
    with db.engine.begin() as conn:
        return run(
            conn,
            store.settle(
                token=claimed.token, results=results, now=now, actor="w1", breaker=breaker
            ),
        )


def endpoints_of(claimed: Any) -> list[uuid.UUID]:
    return [c.delivery.endpoint_id for c in claimed.deliveries]


def test_one_endpoint_never_has_more_in_flight_than_its_cap_and_never_hides_the_others(db):
    busy = add_endpoint(db, "https://busy.example.com/h")
    sent(db, 20)  # 20 due deliveries for the busy endpoint, the oldest
    quiet = add_endpoint(db, "https://quiet.example.com/h", tenant="t_quiet")
    sent(db, 1, tenant="t_quiet")
    first = claim_hooks(db)
    assert sorted(endpoints_of(first)).count(busy.id) == 4
    assert endpoints_of(first).count(quiet.id) == 1
    assert claim_hooks(db).deliveries == []  # busy is full, quiet has nothing more
    settle(db, first, DAction.DELIVER)
    assert endpoints_of(claim_hooks(db)) == [busy.id] * 4  # room again: four more


def test_an_endpoint_failing_in_a_row_pauses_then_probes_once_and_a_success_closes_it(db):
    breaker = Breaker(failures=3, base=timedelta(seconds=30))
    fairness = store.Fairness(in_flight=10, breaker=breaker)
    failing = add_endpoint(db, "https://failing.example.com/h")
    sent(db, 10)
    other = add_endpoint(db, "https://other.example.com/h", tenant="t_other")

    batch = claim_hooks(db, limit=3, fairness=fairness)
    settled = settle(db, batch, DAction.RETRY, breaker=breaker)
    assert settled.paused == {failing.id: T0 + timedelta(seconds=30)}
    sent(db, 2, tenant="t_other")
    # Paused: none of its deliveries is claimed (and none spends an attempt); the others
    # do not notice.
    assert endpoints_of(claim_hooks(db, fairness=fairness)) == [other.id] * 2
    waiting = [r for r in rows(db, failing.id) if r.status == "retrying" or r.status == "pending"]
    assert len(waiting) == 10 and {r.attempts for r in waiting if r.status == "pending"} == {0}

    later = T0 + timedelta(seconds=31)
    probe = claim_hooks(db, now=later, fairness=fairness)
    assert endpoints_of(probe) == [failing.id]  # one probe while the breaker is open
    assert claim_hooks(db, now=later, fairness=fairness).deliveries == []
    again = settle(db, probe, DAction.RETRY, now=later, breaker=breaker)
    assert again.paused == {failing.id: later + timedelta(seconds=60)}  # doubled

    latest = later + timedelta(seconds=61)
    probe = claim_hooks(db, now=latest, fairness=fairness)
    assert settle(db, probe, DAction.DELIVER, now=latest, breaker=breaker).paused == {}
    with db.engine.connect() as conn:
        row = conn.execute(select(hook_endpoints).where(hook_endpoints.c.id == failing.id)).one()
    assert (row.failures_in_row, row.paused_until) == (0, None)
    assert len(claim_hooks(db, now=latest, fairness=fairness).deliveries) == 9  # closed: all


async def test_a_hanging_endpoint_holds_only_its_own_deliveries(db, async_engine):
    # The finding: 150 events to an endpoint that accepts and never answers made another
    # tenant's event wait 19.4 s for its first attempt (HOOK_TIMEOUT 5 s).
    timeout = 5.0
    with Listener() as hanging, HookReceiver() as receiver:
        add_endpoint(db, f"http://127.0.0.1:{hanging.port}/h")
        sent(db, 300)  # more than a claim reads ahead: the other's event is past the head
        other = add_endpoint(db, receiver.url, tenant="t_other")
        receiver.secret = _secret_of(db, other.id)
        sent(db, 1, tenant="t_other")
        deliverer_ = deliverer(async_engine, timeout=timeout, every=0.2)
        started = time.monotonic()
        running = asyncio.ensure_future(deliverer_.run_once())
        try:
            while not receiver.received:
                await asyncio.sleep(0.02)
                assert time.monotonic() - started < 2 * timeout + 5, "the other tenant waited"
            waited = time.monotonic() - started
        finally:
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            await deliverer_.aclose()
        assert hanging.accepted <= 4  # the endpoint's cap, not a batch of 50
    assert waited < timeout + 2, f"the other tenant's first attempt came after {waited:.1f} s"


async def test_a_failing_endpoint_costs_its_own_attempts_only_until_its_breaker_opens(
    db, async_engine
):
    with HookReceiver(fail_first=1000, fail_status=503) as failing:
        endpoint = add_endpoint(db, failing.url)
        failing.secret = _secret_of(db, endpoint.id)
        sent(db, 30)
        deliverer_ = deliverer(
            async_engine,
            fairness=store.Fairness(in_flight=2, breaker=Breaker(failures=4)),
        )
        await deliver(deliverer_)
    spent = sum(row.attempts for row in rows(db))
    # Four failures in a row open the breaker (two more may have been in flight); the rest
    # wait without spending an attempt.
    assert 4 <= spent <= 6 and len(failing.received) == spent
    with db.engine.connect() as conn:
        paused = conn.execute(select(hook_endpoints.c.paused_until)).scalar_one()
    assert paused is not None


# --- leases spend attempts ------------------------------------------------------------------


def test_a_lease_that_runs_out_on_the_last_attempt_ends_the_delivery_dead(db):
    add_endpoint(db, "https://e.example.com/h")
    with db.fanning_out(store.FanOut(max_attempts=2)):
        sent(db, 1)
    at = T0
    for attempt in (1, 2):  # the worker dies mid-POST, twice
        held = claim_hooks(db, now=at)
        assert len(held.deliveries) == 1
        at += timedelta(minutes=2)
        with db.engine.begin() as conn:
            (swept,) = run(conn, store.sweep(now=at, actor="sweeper"))
        assert swept.attempts == attempt
    assert swept.status is DState.DEAD
    assert claim_hooks(db, now=at + timedelta(hours=1)).deliveries == []
    with db.engine.connect() as conn:
        moves = conn.execute(
            select(hook_delivery_events.c.to_status, hook_delivery_events.c.attempt).order_by(
                hook_delivery_events.c.id
            )
        ).all()
    assert [tuple(m) for m in moves][-2:] == [("processing", 2), ("dead", 2)]


# --- a hook never fails the change it reports -------------------------------------------------


def test_the_largest_payload_a_message_can_have_is_written_with_its_change(db):
    # Metadata may be 64 KiB; with the rest of a payload that is more than MariaDB's TEXT
    # holds, which once failed the worker's finalize of the message itself.
    add_endpoint(db, "https://hooks.example.com/h")
    (message,) = sent(db, 1, metadata={"k": "x" * (64 * 1024 - 10)}, subject="s" * 500)
    (row,) = rows(db)
    assert len(row.payload.encode()) > 65_535
    assert f'"message_id":"{message.id}"' in row.payload and "x" * 65_000 in row.payload


async def test_lookups_that_hang_hold_the_resolvers_own_threads_not_the_event_loops(monkeypatch):
    # A receiver's DNS is its owner's to make slow; the SMTP provider resolves its relay
    # in the event loop's default executor, which such lookups must not fill.
    from mailbag.resolver import SystemResolver

    real = socket.getaddrinfo
    released = threading.Event()

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "slow.example.com":
            released.wait(10)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    resolver = SystemResolver(threads=4)
    hanging = [
        asyncio.ensure_future(resolver.addresses("slow.example.com", 443)) for _ in range(12)
    ]
    try:
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(2):  # the relay's lookup is not queued behind them
            assert await loop.getaddrinfo("127.0.0.1", 25)
    finally:
        released.set()
        await asyncio.gather(*hanging, return_exceptions=True)
