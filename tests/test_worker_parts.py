"""The worker's parts on their own, with no database: the ledger, one send attempt (against
the memory provider), the report, the outcome writer, the lease keeper and the side-task
supervisor."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from mailbag.domain.content import Attachment, AttachmentRef
from mailbag.domain.delivery import (
    Accepted,
    Ambiguous,
    Decision,
    Disabled,
    Rejected,
    SendOutcome,
)
from mailbag.domain.message import Message
from mailbag.domain.states import Action, Status
from mailbag.store.dispatch import Finalized
from mailbag.store.message_transitions import Changed, Settled
from mailbag.templates import builtin
from mailbag.templates.book import book_of
from mailbag.worker import WorkerConfig, WorkerFailed
from mailbag.worker.attempt import Sender, chunks
from mailbag.worker.fleet import Fleet
from mailbag.worker.leases import LeaseKeeper
from mailbag.worker.ledger import BACKLOG_FACTOR, Decided, Ledger
from mailbag.worker.report import Report
from mailbag.worker.supervisor import SideTasks
from mailbag.worker.writer import OutcomeWriter

from memory_provider import MemoryProvider

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def claimed(
    template: str | None = "welcome",
    data: dict[str, Any] | None = None,
    ambiguous_since: datetime | None = None,
    **fields: Any,
) -> Message:
    """A message as a claim returns it: `processing`, on its first attempt. `fields` are
    any of Message's (expires_at, attachments, subject, html, ...)."""
    message = Message(
        id=uuid.uuid4(),
        tenant_id="default",
        idempotency_key=None,
        to_address="ada@example.com",
        to_name=None,
        from_address=None,
        subject=None,
        template_name=template,
        template_data={"name": "Ada"} if data is None else data,
        headers={},
        tags=[],
        metadata={},
        status="processing",
        attempt_count=0,
        max_attempts=5,
        next_attempt_at=NOW,
        created_at=NOW,
        updated_at=NOW,
        claim_token=None,
        claimed_by="w",
        claimed_at=NOW,
        lease_expires_at=NOW + timedelta(minutes=2),
        provider=None,
        provider_message_id=None,
        last_error=None,
        sent_at=None,
        ambiguous_since=ambiguous_since,
    )
    return dataclasses.replace(message, **fields)


class Log:
    """Keeps what was logged: (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, fields))

    def events(self, level: str) -> list[str]:
        return [event for lvl, event, _ in self.lines if lvl == level]


DECISION = Decision(Action.MARK_SENT, provider_message_id="p-1")


# --- the ledger -----------------------------------------------------------------------


def test_a_claim_takes_slots_and_a_decision_gives_one_back_before_it_is_written():
    ledger = Ledger(concurrency=3)
    token = uuid.uuid4()
    first, second = claimed(), claimed()
    ledger.claimed(token, [first, second])
    assert (ledger.undecided, ledger.free_slots(), ledger.full) == (2, 1, False)

    decided = ledger.decided(first, DECISION)
    assert (decided.token, decided.message, decided.decision) == (token, first, DECISION)
    assert ledger.slot_freed.is_set()
    assert (ledger.undecided, ledger.unwritten, ledger.free_slots()) == (1, 1, 2)
    assert first.id in ledger.held  # still held (its lease kept) until written

    ledger.written([decided])
    assert (ledger.unwritten, list(ledger.held)) == (0, [second.id])


def test_a_full_ledger_has_no_free_slot():
    ledger = Ledger(concurrency=2)
    ledger.claimed(uuid.uuid4(), [claimed(), claimed()])
    assert ledger.full and ledger.free_slots() == 0


def test_a_backlog_of_unwritten_decisions_frees_no_slot_until_it_is_written():
    ledger = Ledger(concurrency=1)
    decided = []
    for _ in range(BACKLOG_FACTOR - 1):
        message = claimed()
        ledger.claimed(uuid.uuid4(), [message])
        decided.append(ledger.decided(message, DECISION))
    assert ledger.free_slots() == 1  # one short of the backlog: claiming goes on
    message = claimed()
    ledger.claimed(uuid.uuid4(), [message])
    decided.append(ledger.decided(message, DECISION))
    assert ledger.undecided == 0 and ledger.backlogged and ledger.free_slots() == 0
    ledger.written(decided[:1])
    assert ledger.free_slots() == 1


def test_only_what_was_claimed_and_never_sent_is_unstarted():
    ledger = Ledger(concurrency=5)
    sending, decided, idle = claimed(), claimed(), claimed()
    ledger.claimed(uuid.uuid4(), [sending, decided, idle])
    ledger.sending([sending, decided])
    ledger.decided(decided, DECISION)
    assert ledger.unstarted() == [idle]


def test_every_held_message_keeps_its_lease_by_claim_until_it_is_written():
    ledger = Ledger(concurrency=5)
    one, two = uuid.uuid4(), uuid.uuid4()
    a, b, c = claimed(), claimed(), claimed()
    ledger.claimed(one, [a, b])
    ledger.claimed(two, [c])
    item = ledger.decided(a, DECISION)
    assert ledger.by_token() == {one: [a.id, b.id], two: [c.id]}
    ledger.written([item])
    assert ledger.by_token() == {one: [b.id], two: [c.id]}


# --- one attempt ------------------------------------------------------------------------


class Recorder:
    """A Progress that notes what it is told, and lets sends go unless told to refuse."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.started: list[list[Message]] = []
        self.decisions: list[tuple[Message, SendOutcome | None, Decision]] = []

    def start(self, messages: Sequence[Message]) -> bool:
        self.started.append(list(messages))
        return not self.refuse

    def decided(self, message: Message, outcome: SendOutcome | None, decision: Decision) -> None:
        self.decisions.append((message, outcome, decision))


def sender(provider: MemoryProvider, log: Any = None) -> Sender:
    return Sender(
        Fleet.single(provider),
        book_of(builtin()),
        WorkerConfig(worker_id="w"),
        lambda: NOW,
        random.Random(1),
        log or Log(),
    )


async def test_an_accepted_send_is_started_then_decided_sent():
    provider = MemoryProvider()
    message = claimed()
    progress = Recorder()
    await sender(provider).attempt([message], progress)
    assert progress.started == [[message]]
    ((decided, outcome, decision),) = progress.decisions
    assert decided is message and outcome == Accepted(f"mem-{message.id}-1")
    assert decision == Decision(Action.MARK_SENT, provider_message_id=f"mem-{message.id}-1")
    assert [e.message_id for e in provider.sent] == [message.id]


async def test_a_template_that_does_not_render_is_rejected_and_never_sent():
    provider = MemoryProvider()
    broken, fine = claimed(data={}), claimed()  # welcome needs `name`
    progress = Recorder()
    await sender(provider).attempt([broken, fine], progress)
    assert progress.started == [[fine]]  # the broken one never reached the send
    (message, outcome, decision), _ = progress.decisions
    assert message is broken and isinstance(outcome, Rejected)
    assert decision.action is Action.FAIL and "'name' is undefined" in (decision.error or "")
    assert [e.message_id for e in provider.sent] == [fine.id]


async def test_a_provider_that_raises_is_ambiguous_and_unkeyed_even_with_a_key_window():
    def crash(email: Any, nth: int) -> SendOutcome:
        raise RuntimeError("provider bug")

    provider = MemoryProvider(crash, idempotency_window=timedelta(minutes=30))
    log = Log()
    progress = Recorder()
    await sender(provider, log).attempt([claimed()], progress)
    ((_, outcome, decision),) = progress.decisions
    assert outcome == Ambiguous("provider raised RuntimeError: provider bug", keyed=False)
    assert decision.action is Action.MARK_UNKNOWN  # never resent blindly
    assert log.events("exception") == ["provider_crashed"]


async def test_a_send_cancelled_mid_flight_is_decided_ambiguous_then_cancelled():
    provider = MemoryProvider(idempotency_window=timedelta(minutes=30))
    provider.gate = asyncio.Event()  # never opens
    alone, batch = Recorder(), Recorder()
    tasks = [
        asyncio.create_task(sender(provider).attempt([claimed()], alone)),
        asyncio.create_task(sender(provider).attempt([claimed(), claimed()], batch)),
    ]
    while provider.in_flight < 3:
        await asyncio.sleep(0.01)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with pytest.raises(asyncio.CancelledError):
            await task
    ((_, outcome, decision),) = alone.decisions
    assert outcome == Ambiguous("send interrupted by shutdown", keyed=True)
    assert decision.action is Action.RETRY and decision.keep_attempt  # same key, same attempt
    assert [o for _, o, _ in batch.decisions] == [
        Ambiguous("send interrupted by shutdown", keyed=False)
    ] * 2
    assert {d.action for _, _, d in batch.decisions} == {Action.MARK_UNKNOWN}


async def test_a_disabled_provider_releases_the_message_without_spending_the_attempt():
    provider = MemoryProvider(lambda email, nth: Disabled("no API key"))
    progress = Recorder()
    await sender(provider).attempt([claimed()], progress)
    ((_, outcome, decision),) = progress.decisions
    assert outcome == Disabled("no API key")
    assert decision == Decision(Action.RELEASE, error="no API key")


async def test_a_refused_start_hands_the_chunk_back_unsent():
    provider = MemoryProvider()
    progress = Recorder(refuse=True)
    await sender(provider).attempt([claimed(), claimed()], progress)
    assert provider.sent == []
    assert [d.action for _, _, d in progress.decisions] == [Action.RELEASE] * 2
    assert {o for _, o, _ in progress.decisions} == {
        Disabled("worker shutting down before the send")
    }


async def test_a_message_past_its_expiry_lapses_without_a_provider_call():
    provider = MemoryProvider()
    expired, due, later = (
        claimed(expires_at=NOW - timedelta(seconds=1)),
        claimed(expires_at=NOW),  # expires_at is the first moment it may not be sent
        claimed(expires_at=NOW + timedelta(seconds=1)),
    )
    progress = Recorder()
    await sender(provider).attempt([expired, due, later], progress)
    assert progress.started == [[later]]
    assert [e.message_id for e in provider.sent] == [later.id]
    (first, outcome, decision), (second, _, lapsed), _ = progress.decisions
    assert (first, second, outcome) == (expired, due, None)  # the provider was not asked
    assert decision.action is Action.LAPSE is lapsed.action
    assert decision.error == (
        "expired before it could be sent (expires_at 2026-01-01T11:59:59+00:00)"
    )


def ref(attachment: Attachment) -> AttachmentRef:
    return AttachmentRef(
        attachment.filename,
        attachment.content_type,
        attachment.size,
        attachment.sha256,
        attachment.content_id,
    )


PDF = Attachment("invoice.pdf", "application/pdf", b"%PDF-1.4 invoice", None)
LOGO = Attachment("logo.png", "image/png", b"\x89PNG logo", "logo")


async def test_attachments_are_sent_with_the_bytes_read_with_the_claim():
    provider = MemoryProvider()
    message = claimed(
        template=None,
        subject="Your invoice",
        html='<p>Invoice attached</p><img src="cid:logo">',
        text="Invoice attached",
        attachments=(ref(PDF), ref(LOGO)),
    )
    plain = claimed()
    contents = {PDF.sha256: PDF.content, LOGO.sha256: LOGO.content}
    progress = Recorder()
    await sender(provider).attempt([message, plain], progress, contents)
    assert [d.action for _, _, d in progress.decisions] == [Action.MARK_SENT] * 2
    with_files, without = provider.sent
    assert list(with_files.attachments) == [PDF, LOGO]
    assert with_files.subject == "Your invoice" and "cid:logo" in with_files.html
    assert without.attachments == ()


async def test_a_message_whose_attachment_bytes_are_missing_fails_and_is_never_sent():
    provider = MemoryProvider()
    message = claimed(attachments=(ref(PDF),))
    progress = Recorder()
    await sender(provider).attempt([message], progress, {})
    ((_, outcome, decision),) = progress.decisions
    assert outcome == Rejected("attachment 'invoice.pdf' is missing")
    assert decision.action is Action.FAIL and provider.sent == []


def test_the_report_counts_expired_and_ready_made_messages_under_their_own_labels():
    def counted(state: str, template: str) -> float:
        name = "mailbag_messages_expired_total" if state == "expired" else f"mailbag_{state}_total"
        labels = {"provider": "memory", "template": template}
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = counted("expired", "welcome"), counted("sent", "(ready-made)")
    token = uuid.uuid4()
    lapsed, ready_made = claimed(), claimed(template=None)
    lapse = Decision(Action.LAPSE, error="expired before it could be sent")
    items = [Decided(token, lapsed, lapse), Decided(token, ready_made, DECISION)]
    changed = [
        Changed(
            Settled(m.id, "default", state, 0, m.template_name, {}, None, None, None),
            Status.PROCESSING,
        )
        for m, state in ((lapsed, "expired"), (ready_made, "sent"))
    ]
    report = Report(Log(), "memory")
    report.written([(items, Finalized(changed))])
    after = counted("expired", "welcome"), counted("sent", "(ready-made)")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
    assert (report.stats["lapse"], report.stats["mark_sent"]) == (1, 1)


def test_keyed_retries_go_alone_and_the_rest_in_chunks_of_the_batch_size():
    keyed = [claimed(ambiguous_since=NOW) for _ in range(2)]
    rest = [claimed() for _ in range(5)]
    mixed = [rest[0], keyed[0], *rest[1:3], keyed[1], *rest[3:]]
    assert chunks(mixed, 2) == [[keyed[0]], [keyed[1]], rest[0:2], rest[2:4], rest[4:]]
    assert chunks(rest, 0) == [[m] for m in rest]  # a batch size under 1 means one by one


# --- the outcome writer -----------------------------------------------------------------


class Store:
    """A write function that keeps the batches it wrote, and can fail or hang on demand."""

    def __init__(self, failures: Sequence[BaseException] = (), hold: float = 0.0) -> None:
        self.failures = list(failures)
        self.hold = hold
        self.calls: list[list[str]] = []
        self.written: list[list[str]] = []

    async def write(self, batch: list[str]) -> int:
        self.calls.append(list(batch))
        if self.hold:
            await asyncio.sleep(self.hold)
        if self.failures:
            raise self.failures.pop(0)
        return len(batch)

    def done(self, batch: list[str], result: int) -> None:
        assert result == len(batch)
        self.written.append(list(batch))


def writer(store: Store, log: Any = None, **options: Any) -> OutcomeWriter[str, int]:
    options.setdefault("max_size", 100)
    options.setdefault("backoff", (0.01, 0.02))
    return OutcomeWriter(store.write, store.done, retry_on=(OSError,), log=log or Log(), **options)


async def eventually(condition: Any, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


async def test_the_writer_takes_whatever_accumulated_while_the_last_write_ran():
    store = Store(hold=0.05)
    out = writer(store)
    task = out.start()
    out.put("a")
    await eventually(lambda: store.calls)
    out.put("b")
    out.put("c")
    await eventually(lambda: len(store.written) == 2)
    assert store.written == [["a"], ["b", "c"]] and out.pending == 0
    task.cancel()


async def test_the_writer_flushes_as_soon_as_a_batch_is_full():
    store = Store()
    out = writer(store, max_size=3, max_wait=10.0)
    task = out.start()
    out.put("a")
    await asyncio.sleep(0.02)  # the writer waits for more, up to max_wait
    for item in "bcd":
        out.put(item)
    await eventually(lambda: store.written)
    await asyncio.sleep(0.05)
    assert store.written == [["a", "b", "c"]] and out.pending == 1  # "d" waits for more
    task.cancel()


async def test_the_writer_flushes_a_partial_batch_when_its_time_is_up():
    store = Store()
    # A wide margin between the checks and max_wait: a loaded CI machine stalls the loop.
    out = writer(store, max_size=100, max_wait=1.0)
    task = out.start()
    out.put("a")
    await asyncio.sleep(0.02)
    out.put("b")
    await asyncio.sleep(0.03)
    assert store.written == []  # not before its time
    await eventually(lambda: store.written)
    assert store.written == [["a", "b"]]
    task.cancel()


async def test_a_failing_write_is_retried_with_backoff_and_nothing_is_lost():
    store = Store(failures=[OSError("connection refused"), TimeoutError("slow")])
    log = Log()
    out = writer(store, log, backoff=(0.01, 0.015))
    task = out.start()
    out.put("a")
    out.put("b")
    await eventually(lambda: store.written)
    assert store.calls == [["a", "b"]] * 3 and store.written == [["a", "b"]]
    retries = [fields for level, event, fields in log.lines if event == "finalize_failed"]
    assert [r["retry_in"] for r in retries] == [0.01, 0.015]
    assert retries[0]["error"] == "OSError: connection refused" and retries[0]["pending"] == 2
    assert not task.done()
    task.cancel()


async def test_a_write_that_raises_a_bug_ends_the_writer_and_the_drain_writes_its_batch():
    store = Store(failures=[RuntimeError("bug")])
    out = writer(store)
    task = out.start()
    out.put("a")
    await eventually(task.done)
    assert isinstance(task.exception(), RuntimeError) and out.pending == 1
    out.put("b")
    assert await out.drain(1.0)
    assert store.written == [["a", "b"]]


async def test_the_drain_waits_for_the_running_write_and_what_came_after():
    store = Store(hold=0.05)
    out = writer(store)
    task = out.start()
    out.put("a")
    await eventually(lambda: store.calls)
    out.put("b")
    assert await out.drain(1.0)
    assert store.written == [["a"], ["b"]] and not task.done()
    task.cancel()


async def test_the_drain_gives_up_after_its_grace_and_says_so():
    store = Store(failures=[OSError("down")] * 100)
    out = writer(store, backoff=(0.01, 0.01))
    task = out.start()
    out.put("a")
    assert not await out.drain(0.1)
    assert store.written == [] and out.pending == 1
    task.cancel()


async def test_a_drain_with_nothing_put_returns_at_once():
    assert await writer(Store()).drain(0.0)


# --- the lease keeper -------------------------------------------------------------------


async def test_the_keeper_extends_every_held_lease_while_entered_and_stops_after():
    token, ids = uuid.uuid4(), [uuid.uuid4(), uuid.uuid4()]
    extended: list[dict[uuid.UUID, list[uuid.UUID]]] = []

    async def extend(by_token: Any) -> None:
        extended.append(dict(by_token))

    keeper = LeaseKeeper(
        extend, lambda: {token: ids}, lease=timedelta(seconds=0.15), retry_on=(OSError,), log=Log()
    )
    async with keeper as task:
        await asyncio.sleep(0.18)
        assert len(extended) >= 2 and extended[0] == {token: ids}  # every third of a lease
    assert task.cancelled()
    calls = len(extended)
    await asyncio.sleep(0.12)
    assert len(extended) == calls


async def test_the_keeper_skips_rounds_with_nothing_held():
    calls = 0

    async def extend(by_token: Any) -> None:
        nonlocal calls
        calls += 1

    keeper = LeaseKeeper(
        extend, dict, lease=timedelta(seconds=0.15), retry_on=(OSError,), log=Log()
    )
    async with keeper:
        await asyncio.sleep(0.12)
    assert calls == 0


async def test_the_keeper_logs_a_database_error_and_keeps_going_but_dies_of_a_bug():
    errors: list[BaseException] = [OSError("down"), ValueError("bug")]

    async def extend(by_token: Any) -> None:
        raise errors.pop(0)

    log = Log()
    keeper = LeaseKeeper(
        extend,
        lambda: {uuid.uuid4(): [uuid.uuid4()]},
        lease=timedelta(seconds=0.15),
        retry_on=(OSError,),
        log=log,
    )
    async with keeper as task:
        await eventually(task.done)
        assert isinstance(task.exception(), ValueError)  # for the supervisor to see
    assert log.events("warning") == ["lease_extension_failed"]


# --- the supervisor -----------------------------------------------------------------------


async def test_a_side_task_that_ends_halts_the_worker_and_stop_ends_the_rest():
    log = Log()
    side = SideTasks(log)

    async def forever() -> None:
        await asyncio.Event().wait()

    async def broken() -> None:
        raise ValueError("a bug")

    alive = side.start("alive", forever())
    side.start("broken", broken())
    await asyncio.wait_for(side.halted.wait(), 1.0)
    assert isinstance(side.failure, WorkerFailed) and "broken" in str(side.failure)
    assert isinstance(side.failure.__cause__, ValueError)
    assert log.events("error") == ["worker_helper_died"]
    await side.stop()
    assert alive.cancelled() and side.tasks == {}
    assert log.events("error") == ["worker_helper_died"]  # stopped on purpose: no more


@pytest.mark.parametrize(
    "failure",
    [ValueError("a bug"), KeyError("k"), UnicodeError("idna"), TypeError("t"), RecursionError()],
    ids=lambda exc: type(exc).__name__,
)
async def test_an_optional_part_that_fails_any_way_is_counted_and_restarted_with_backoff(
    monkeypatch, failure
):
    from mailbag.worker import supervisor

    monkeypatch.setattr(supervisor, "RESTART_BACKOFF", (0.02, 0.08))
    log = Log()
    side = SideTasks(log)
    runs: list[float] = []

    async def flaky() -> None:
        runs.append(asyncio.get_running_loop().time())
        if len(runs) <= 3:
            raise failure
        await asyncio.Event().wait()  # the fourth run stays up

    before = REGISTRY.get_sample_value("mailbag_side_task_failures_total", {"task": "flaky"}) or 0
    side.start_optional("flaky", flaky)
    await eventually(lambda: len(runs) == 4)
    assert not side.halted.is_set() and side.failure is None  # the worker goes on
    assert log.events("error") == ["side_task_failed"] * 3
    gaps = [later - earlier for earlier, later in itertools.pairwise(runs)]
    assert gaps[0] >= 0.02 and gaps[1] >= 0.04 and gaps[2] >= 0.08  # doubling, then the cap
    after = REGISTRY.get_sample_value("mailbag_side_task_failures_total", {"task": "flaky"})
    assert after == before + 3
    await side.stop()
    assert side.tasks == {} and not side.halted.is_set()


async def test_side_tasks_stopped_on_purpose_are_no_failure():
    log = Log()
    side = SideTasks(log)
    side.start("alive", asyncio.Event().wait())  # type: ignore[arg-type]
    await asyncio.sleep(0)
    await side.stop()
    assert side.failure is None and not side.halted.is_set() and log.lines == []
