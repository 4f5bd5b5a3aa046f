"""mailbag.client without a server: the plans fed with answers, the retry policy's waits,
the error classes, and the client's copy of the wire format held to the server's."""

from __future__ import annotations

import base64
import inspect
import socket
import subprocess
import sys
import typing
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from mailbag.api.batch import BatchOut, ItemResult
from mailbag.api.schemas import MessageCreate, MessageOut, VerificationOut
from mailbag.client import (
    Address,
    APIError,
    AsyncClient,
    Attachment,
    AuthenticationFailed,
    BadRequest,
    BatchItemResult,
    BatchResult,
    Client,
    Conflict,
    ConnectionFailed,
    FieldError,
    IdempotencyKeyReused,
    Message,
    MessageStatus,
    NotCancellable,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    RetryPolicy,
    ServerError,
    ServiceUnavailable,
    ValidationError,
    Verification,
    VerificationState,
    draft,
)
from mailbag.client.core import Core, Send, Wait
from mailbag.client.operations import MessagePlans, VerificationPlans
from mailbag.domain.states import Status
from mailbag.domain.verification import VState

BASE = "http://mailbag.test"
NOW = "2026-11-30T12:00:00Z"
MESSAGE: dict[str, Any] = {
    "id": "0b7e5a3c-3f52-4f7e-9d0e-6a8f0e1f2a3b",
    "status": "pending",
    "to": "ada@example.com",
    "to_name": None,
    "recipients": {"to": [{"address": "ada@example.com", "name": None}], "cc": [], "bcc": []},
    "template": "welcome",
    "subject": None,
    "data": {"name": "Ada"},
    "tags": [],
    "metadata": {},
    "headers": {},
    "attempt_count": 0,
    "max_attempts": 5,
    "next_attempt_at": NOW,
    "created_at": NOW,
    "updated_at": NOW,
    "sent_at": None,
    "provider": None,
    "provider_message_id": None,
    "last_error": None,
    "a_field_from_a_newer_server": 1,
}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def core(retry: RetryPolicy | None = None, clock: FakeClock | None = None) -> Core:
    return Core(
        BASE, "k-secret", retry or RetryPolicy(), clock=clock or FakeClock(), rng=lambda: 0.0
    )


def answer(status: int, body: Any = None, **headers: str) -> httpx.Response:
    if status >= 400 and body is None:
        body = {"type": f"https://mailbag.dev/problems/s{status}", "title": "T", "status": status}
    media = "application/problem+json" if status >= 400 else "application/json"
    return httpx.Response(
        status,
        json=body,
        headers={"content-type": media, **headers},
        request=httpx.Request("GET", BASE),
    )


def problem(status: int, slug: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": f"https://mailbag.dev/problems/{slug}",
        "title": slug,
        "status": status,
        **extra,
    }


def drive(plan: Any, outcomes: list[Any], clock: FakeClock | None = None) -> tuple[Any, list[Any]]:
    """Feed the plan each outcome in turn for its Sends (a Wait advances the clock): what
    it returned (or raised) and the steps it took."""
    steps: list[Any] = []
    given = iter(outcomes)
    try:
        step = next(plan)
        while True:
            steps.append(step)
            if isinstance(step, Wait):
                if clock is not None:
                    clock.now += step.seconds
                step = plan.send(None)
            else:
                step = plan.send(next(given))
    except StopIteration as done:
        return done.value, steps
    except Exception as exc:
        return exc, steps


def sends(steps: list[Any]) -> list[Send]:
    return [s for s in steps if isinstance(s, Send)]


def waits(steps: list[Any]) -> list[float]:
    return [s.seconds for s in steps if isinstance(s, Wait)]


def test_a_send_retried_after_a_503_uses_the_same_idempotency_key_on_every_attempt():
    plan = MessagePlans(core()).send("ada@example.com", template="welcome")
    outcomes = [
        answer(503, problem(503, "database-unavailable"), **{"Retry-After": "2"}),
        httpx.ConnectError("refused"),
        answer(201, MESSAGE, **{"Idempotent-Replayed": "true"}),
    ]
    result, steps = drive(plan, outcomes)
    assert isinstance(result, Message) and result.replayed and result.status == "pending"
    keys = {s.headers["Idempotency-Key"] for s in sends(steps)}
    assert len(sends(steps)) == 3 and len(keys) == 1
    assert waits(steps)[0] == 2.0  # Retry-After, and the rng gave no extra
    assert sends(steps)[0].headers["Authorization"] == "Bearer k-secret"


def test_each_logical_call_gets_its_own_key_unless_the_caller_gives_one():
    plans = MessagePlans(core())
    keys = [
        sends(drive(plans.send("a@example.com", template="w"), [answer(201, MESSAGE)])[1])[
            0
        ].headers["Idempotency-Key"]
        for _ in range(2)
    ]
    assert keys[0] != keys[1]
    _, steps = drive(
        plans.send("a@example.com", template="w", idempotency_key="order-7"), [answer(201, MESSAGE)]
    )
    assert sends(steps)[0].headers["Idempotency-Key"] == "order-7"


@pytest.mark.parametrize(
    ("status", "slug", "kind"),
    [
        (400, "invalid-cursor", BadRequest),
        (401, "unauthorized", AuthenticationFailed),
        (404, "not-found", NotFound),
        (409, "idempotency-key-reused", IdempotencyKeyReused),
        (409, "not-allowed", Conflict),
        (413, "message-too-large", PayloadTooLarge),
        (422, "invalid-message", ValidationError),
        (500, "internal-error", ServerError),
    ],
)
def test_an_error_answer_that_retrying_cannot_change_is_raised_after_one_attempt(
    status, slug, kind
):
    body = problem(status, slug, detail="why", errors={"to": "bad"})
    error, steps = drive(
        MessagePlans(core()).send("a@example.com", template="w"),
        [answer(status, body, **{"X-Request-ID": "req-1"})],
    )
    assert type(error) is kind and len(sends(steps)) == 1
    assert (error.status, error.slug, error.detail, error.errors) == (
        status,
        slug,
        "why",
        [FieldError("to", "bad")],
    )
    assert error.request_id == "req-1" and error.attempts == 1
    assert error.problem["errors"] == {"to": "bad"}


def test_a_retry_after_too_long_to_wait_is_raised_at_once_with_its_seconds():
    error, steps = drive(
        VerificationPlans(core()).resend("v-1"),
        [answer(429, problem(429, "rate-limited"), **{"Retry-After": "3600"})],
    )
    assert isinstance(error, RateLimited) and error.retry_after == 3600.0
    assert len(sends(steps)) == 1


def test_a_retry_after_date_is_read_against_the_answers_own_date():
    # The server's clock is a day off ours: its Date header is what the date is relative to.
    server_now = datetime.now(UTC) - timedelta(days=1)
    headers = {
        "Date": format_datetime(server_now, usegmt=True),
        "Retry-After": format_datetime(server_now + timedelta(seconds=7), usegmt=True),
    }
    result, steps = drive(
        MessagePlans(core()).get("m-1"), [answer(503, **headers), answer(200, MESSAGE)]
    )
    assert isinstance(result, Message)
    assert waits(steps) == [pytest.approx(7.0, abs=1.0)]


def test_backoff_doubles_up_to_its_ceiling_and_gives_up_after_max_attempts():
    policy = RetryPolicy(max_attempts=6, backoff=1.0, max_backoff=4.0, max_elapsed=1000)
    refused = httpx.ConnectError("refused")
    error, steps = drive(MessagePlans(core(policy)).get("m-1"), [refused] * 6)
    assert waits(steps) == [0.5, 1.0, 2.0, 2.0, 2.0]  # half of the ceiling fixed (rng 0)
    assert isinstance(error, ConnectionFailed) and error.attempts == 6
    assert error.__cause__ is refused
    assert "k-secret" not in str(error)


def test_jitter_spreads_the_wait_over_the_ceilings_upper_half():
    seen = [
        RetryPolicy(backoff=2.0).wait(1, httpx.ReadTimeout("slow"), 0.0, lambda r=r: r)
        for r in (0.0, 0.5, 0.999)
    ]
    assert seen == [1.0, 1.5, pytest.approx(1.999)]


def test_no_wait_runs_past_the_calls_time_budget():
    clock = FakeClock()
    policy = RetryPolicy(max_attempts=100, backoff=4.0, max_backoff=4.0, max_elapsed=10.0)
    error, steps = drive(
        MessagePlans(core(policy, clock)).get("m-1"), [httpx.ReadTimeout("slow")] * 100, clock
    )
    assert isinstance(error, ConnectionFailed)
    assert waits(steps) == [2.0] * 5 and clock.now == 10.0


def test_only_failures_without_an_answer_are_retried_among_transport_errors():
    policy = RetryPolicy()
    for retried in (
        httpx.ConnectError("x"),
        httpx.ReadTimeout("x"),
        httpx.RemoteProtocolError("x"),
    ):
        assert policy.wait(1, retried, 0.0, lambda: 0.0) is not None
    assert policy.wait(1, httpx.LocalProtocolError("x"), 0.0, lambda: 0.0) is None
    assert policy.wait(1, answer(502), 0.0, lambda: 0.0) is not None
    assert policy.wait(1, answer(504), 0.0, lambda: 0.0) is not None


def test_an_error_page_that_is_not_a_problem_still_gets_its_status_class():
    page = httpx.Response(502, text="<html>bad gateway</html>", request=httpx.Request("GET", BASE))
    error, _ = drive(MessagePlans(core(RetryPolicy(max_attempts=1))).get("m-1"), [page])
    assert isinstance(error, ServiceUnavailable) and error.title == "Bad Gateway"
    assert error.problem == {} and error.retry_after is None


def test_a_cancel_whose_first_answer_was_lost_returns_the_message_it_cancelled():
    gone = httpx.RemoteProtocolError("Server disconnected without sending a response.")
    cancelled = {**MESSAGE, "status": "cancelled"}
    refused = answer(409, problem(409, "not-cancellable", status_now="cancelled"))
    result, steps = drive(
        MessagePlans(core()).cancel("m-1"), [gone, refused, answer(200, cancelled)]
    )
    assert isinstance(result, Message) and result.status == "cancelled"
    assert [(s.method, s.url) for s in sends(steps)][-1] == ("GET", f"{BASE}/v1/messages/m-1")
    # Asked once and refused: the message was cancelled before, not by this call.
    error, _ = drive(MessagePlans(core()).cancel("m-1"), [refused])
    assert isinstance(error, NotCancellable) and error.status_now == "cancelled"


def test_send_writes_every_field_the_api_accepts_and_only_what_was_given():
    at = datetime(2026, 12, 1, 9, tzinfo=UTC)
    everything = {
        "to": [Address("ada@example.com", "Ada"), "bob@example.com"],
        "to_name": None,
        "cc": "c@example.com",
        "bcc": ["d@example.com"],
        "reply_to": Address("r@example.com"),
        "from_address": "billing@acme.example",
        "from_name": "Acme",
        "template": None,
        "data": {"n": 1},
        "locale": "fr-CA",
        "subject": "Hi",
        "html": "<p>Hi</p>",
        "text": "Hi",
        "inline_css": True,
        "attachments": [
            Attachment("a.pdf", b"%PDF-1.4", "application/pdf"),
            Attachment("l.png", b"\x89PNG", content_id="logo"),
        ],
        "send_at": at,
        "expires_at": at + timedelta(days=1),
        "priority": "high",
        "unsubscribe_url": "https://acme.example/u",
        "unsubscribe_mailto": "u@acme.example",
        "tags": ["t"],
        "metadata": {"order": 1},
        "headers": {"X-A": "b"},
        "bulk": True,
    }
    accepted = {field.alias or name for name, field in MessageCreate.model_fields.items()}
    parameters = set(inspect.signature(draft).parameters) - {"idempotency_key"}
    assert parameters == set(everything)
    # send takes exactly what draft takes (help() and editors see it too)
    send_parameters = list(inspect.signature(Client(BASE, "k").messages.send).parameters)
    assert send_parameters == list(inspect.signature(draft).parameters)
    _, steps = drive(MessagePlans(core()).send(**everything), [answer(201, MESSAGE)])
    body = sends(steps)[0].json
    assert set(body) == accepted - {"to_name", "template"}  # the two left None
    MessageCreate.model_validate(body)  # the server's own schema takes it
    assert body["to"] == [{"address": "ada@example.com", "name": "Ada"}, "bob@example.com"]
    assert body["reply_to"] == [{"address": "r@example.com"}]
    assert base64.b64decode(body["attachments"][0]["content"]) == b"%PDF-1.4"
    assert body["attachments"][1] == {
        "filename": "l.png",
        "content": "iVBORw==",
        "content_id": "logo",
    }
    assert body["send_at"] == "2026-12-01T09:00:00+00:00"
    _, steps = drive(
        MessagePlans(core()).send("a@example.com", template="w"), [answer(201, MESSAGE)]
    )
    assert sends(steps)[0].json == {"to": "a@example.com", "template": "w"}


def test_the_clients_models_read_what_the_server_writes():
    # The client keeps its own copy of the wire format; this holds it to the server's.
    assert set(typing.get_args(MessageStatus)) == {s.value for s in Status}
    assert set(typing.get_args(VerificationState)) == {s.value for s in VState}
    pairs = [
        (Message, MessageOut),
        (Verification, VerificationOut),
        (BatchResult, BatchOut),
        (BatchItemResult, ItemResult),
    ]
    for ours, theirs in pairs:
        names = lambda model: {f.alias or n for n, f in model.model_fields.items()}  # noqa: E731
        assert names(theirs) <= names(ours)
    parsed = Message.model_validate(MESSAGE)
    assert parsed.created_at == datetime(2026, 11, 30, 12, tzinfo=UTC)
    assert parsed.recipients.to == [Address("ada@example.com")]


def test_importing_the_client_loads_neither_the_server_nor_the_database_layer():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, mailbag.client; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "mailbag.client" in loaded
    heavy = [
        m for m in loaded if m.split(".")[0] in {"fastapi", "starlette", "sqlalchemy", "uvicorn"}
    ]
    assert heavy == [] and not any(
        m.startswith(("mailbag.api", "mailbag.store", "mailbag.domain")) for m in loaded
    )


def recorder(
    answers: list[Callable[[httpx.Request], httpx.Response]], seen: list[httpx.Request]
) -> Callable[[httpx.Request], httpx.Response]:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers[len(seen) - 1](request)

    return handle


def flaky(seen: list[httpx.Request]) -> Callable[[httpx.Request], httpx.Response]:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    return recorder(
        [
            refuse,
            lambda r: httpx.Response(429, headers={"Retry-After": "0"}),
            lambda r: httpx.Response(201, json=MESSAGE),
        ],
        seen,
    )


FAST = RetryPolicy(backoff=0.01)


def test_the_blocking_client_performs_the_plan_through_a_transport():
    seen: list[httpx.Request] = []
    with Client(
        BASE + "/", "k-secret", transport=httpx.MockTransport(flaky(seen)), retry=FAST
    ) as client:
        message = client.messages.send("ada@example.com", template="welcome")
        assert "k-secret" not in repr(client)
    assert message.id == MESSAGE["id"] and len(seen) == 3
    assert {r.headers["Idempotency-Key"] for r in seen} != {None} and len(
        {r.headers["Idempotency-Key"] for r in seen}
    ) == 1
    assert str(seen[0].url) == f"{BASE}/v1/messages"


async def test_the_async_client_performs_the_same_plan():
    seen: list[httpx.Request] = []
    async with AsyncClient(
        BASE, "k-secret", transport=httpx.MockTransport(flaky(seen)), retry=FAST
    ) as client:
        message = await client.messages.send("ada@example.com", template="welcome")
    assert message.id == MESSAGE["id"] and len(seen) == 3
    assert len({r.headers["Idempotency-Key"] for r in seen}) == 1


def test_an_injected_http_client_is_used_with_its_hooks_and_left_open():
    seen: list[httpx.Request] = []
    hooked: list[int] = []
    http = httpx.Client(
        transport=httpx.MockTransport(
            recorder([lambda r: httpx.Response(200, json=MESSAGE)], seen)
        ),
        event_hooks={"response": [lambda response: hooked.append(response.status_code)]},
        headers={"X-Team": "billing"},
    )
    with Client(BASE, "k", http_client=http) as client:
        client.messages.get("m-1")
    assert hooked == [200] and seen[0].headers["X-Team"] == "billing"
    assert not http.is_closed
    http.close()


def test_a_client_refuses_a_missing_key_or_a_base_url_that_is_not_http():
    with pytest.raises(ValueError, match="API key"):
        Client(BASE, "")
    with pytest.raises(ValueError, match="http"):
        Client("127.0.0.1:8000", "k")
    assert issubclass(ConnectionFailed, Exception) and issubclass(RateLimited, APIError)


def test_a_batch_sends_each_drafts_body_with_its_own_key_under_one_key_for_the_whole():
    drafts = [
        draft("a@example.com", template="welcome", data={"name": "A"}, idempotency_key="a-1"),
        draft("b@example.com", subject="Hi", text="Hello"),
    ]
    answered = {
        "created": 1,
        "existing": 0,
        "invalid": 1,
        "results": [
            {"index": 0, "result": "created", "message": MESSAGE, "error": None},
            {
                "index": 1,
                "result": "invalid",
                "message": None,
                "error": problem(422, "invalid-message", errors={"to": "bad"}),
            },
        ],
    }
    result, steps = drive(
        MessagePlans(core()).send_batch(drafts),
        [httpx.ConnectError("refused"), answer(200, answered, **{"Idempotent-Replayed": "true"})],
    )
    first, second = sends(steps)
    assert (
        first.url == f"{BASE}/v1/messages/batch"
        and first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]
    )
    assert first.json == {
        "messages": [
            {
                "to": "a@example.com",
                "template": "welcome",
                "data": {"name": "A"},
                "idempotency_key": "a-1",
            },
            {"to": "b@example.com", "subject": "Hi", "text": "Hello"},
        ]
    }
    assert result.replayed and (result.created, result.invalid) == (1, 1)
    assert result.results[0].message.id == MESSAGE["id"]
    assert result.results[1].error.errors == [FieldError("to", "bad")]
    assert result.results[1].error.status == 422


def test_a_port_nobody_listens_on_ends_in_connection_failed_after_every_attempt():
    with socket.socket() as s:  # a port that was free a moment ago, and nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen: list[httpx.Request] = []
    http = httpx.Client(event_hooks={"request": [seen.append]})
    with http, pytest.raises(ConnectionFailed) as failed:
        Client(
            f"http://127.0.0.1:{port}",
            "k-secret",
            http_client=http,
            retry=RetryPolicy(max_attempts=3, backoff=0.01),
        ).messages.send("ada@example.com", template="welcome")
    assert failed.value.attempts == 3 and isinstance(failed.value.__cause__, httpx.ConnectError)
    assert len(seen) == 3 and len({r.headers["Idempotency-Key"] for r in seen}) == 1
