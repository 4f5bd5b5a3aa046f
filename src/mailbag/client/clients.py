"""`Client` (blocking) and `AsyncClient`: drivers that perform the plans of client/core.py.

Each public method is made from its plan by `blocking` or `awaiting`, which keep the plan's
signature and docstring: an operation is written once (client/operations.py) and both
clients have it, typed the same. Only the loops that perform the steps, and the paging
iterators, exist in two versions, because one blocks and the other awaits.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

import httpx

from mailbag.client.core import Core, Plan, Send, Wait
from mailbag.client.models import Message, MessagePage, MessageStatus
from mailbag.client.operations import MAX_PAGE_SIZE, MessagePlans, VerificationPlans
from mailbag.client.retry import Outcome, RetryPolicy

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_TIMEOUT = 30.0
DEFAULT_RETRY = RetryPolicy()


def _request(http: httpx.Client | httpx.AsyncClient, step: Send, timeout: Any) -> httpx.Request:
    return http.build_request(
        step.method,
        step.url,
        headers=step.headers,
        json=step.json,
        params=step.params or None,
        timeout=timeout,
    )


class Blocking:
    """Performs a plan's steps with an httpx.Client and time.sleep."""

    def __init__(
        self, http: httpx.Client, timeout: float | httpx.Timeout, sleep: Callable[[float], None]
    ) -> None:
        self.http, self.timeout, self.sleep = http, timeout, sleep

    def run(self, plan: Plan[R]) -> R:
        outcome: Outcome | None = None
        try:
            step = next(plan)
            while True:
                if isinstance(step, Wait):
                    self.sleep(step.seconds)
                    outcome = None
                else:
                    try:
                        outcome = self.http.send(_request(self.http, step, self.timeout))
                    except httpx.TransportError as exc:
                        outcome = exc
                step = plan.send(outcome)
        except StopIteration as done:
            result: R = done.value
            return result


class Awaiting:
    """Performs a plan's steps with an httpx.AsyncClient and asyncio.sleep."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        timeout: float | httpx.Timeout,
        sleep: Callable[[float], Coroutine[Any, Any, None]],
    ) -> None:
        self.http, self.timeout, self.sleep = http, timeout, sleep

    async def run(self, plan: Plan[R]) -> R:
        outcome: Outcome | None = None
        try:
            step = next(plan)
            while True:
                if isinstance(step, Wait):
                    await self.sleep(step.seconds)
                    outcome = None
                else:
                    try:
                        outcome = await self.http.send(_request(self.http, step, self.timeout))
                    except httpx.TransportError as exc:
                        outcome = exc
                step = plan.send(outcome)
        except StopIteration as done:
            result: R = done.value
            return result


class _BlockingResource:
    def __init__(self, driver: Blocking, plans: Any) -> None:
        self._driver, self._plans = driver, plans


class _AwaitingResource:
    def __init__(self, driver: Awaiting, plans: Any) -> None:
        self._driver, self._plans = driver, plans


def _performing(method: Callable[..., Any], plan: Callable[..., Any]) -> None:
    # help() and editors show the plan's parameters, not its Plan[...] return type.
    functools.update_wrapper(method, plan)
    method.__signature__ = inspect.signature(plan).replace(  # type: ignore[attr-defined]
        return_annotation=inspect.Signature.empty
    )


def blocking(
    plan: Callable[Concatenate[Any, P], Plan[R]],
) -> Callable[Concatenate[_BlockingResource, P], R]:
    """The plan as a method that performs it and returns its result."""

    def method(self: _BlockingResource, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._driver.run(plan(self._plans, *args, **kwargs))

    _performing(method, plan)
    return method


def awaiting(
    plan: Callable[Concatenate[Any, P], Plan[R]],
) -> Callable[Concatenate[_AwaitingResource, P], Coroutine[Any, Any, R]]:
    """The plan as a coroutine method that performs it and returns its result."""

    async def method(self: _AwaitingResource, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await self._driver.run(plan(self._plans, *args, **kwargs))

    _performing(method, plan)
    return method


class Paging:
    """Where `iter` is across the pages, the same for both clients: which page to ask for
    next, and how many of its messages to yield so that no more than `limit` are."""

    def __init__(self, limit: int | None, page_size: int) -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be 0 or more (None for all), not {limit}")
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be 1 to {MAX_PAGE_SIZE}, not {page_size}")
        self.left, self.page_size = limit, page_size
        self.cursor: str | None = None
        self.done = limit == 0

    def next_page_size(self) -> int | None:
        """How many to ask for next; None: nothing more is wanted."""
        if self.done:
            return None
        return self.page_size if self.left is None else min(self.page_size, self.left)

    def taken(self, page: MessagePage) -> list[Message]:
        items = page.items if self.left is None else page.items[: self.left]
        if self.left is not None:
            self.left -= len(items)
        self.cursor = page.next_cursor
        self.done = page.next_cursor is None or self.left == 0
        return items


class Messages(_BlockingResource):
    send = blocking(MessagePlans.send)
    send_batch = blocking(MessagePlans.send_batch)
    get = blocking(MessagePlans.get)
    list = blocking(MessagePlans.list)
    cancel = blocking(MessagePlans.cancel)

    def iter(
        self,
        *,
        status: MessageStatus | None = None,
        to: str | None = None,
        limit: int | None = None,
        page_size: int = MAX_PAGE_SIZE,
    ) -> Iterator[Message]:
        """Every message, newest first (at most `limit` of them; None: all), fetched
        `page_size` (1 to 100) per request."""
        paging = Paging(limit, page_size)
        while (wanted := paging.next_page_size()) is not None:
            page = self.list(status=status, to=to, limit=wanted, cursor=paging.cursor)
            yield from paging.taken(page)


class AsyncMessages(_AwaitingResource):
    send = awaiting(MessagePlans.send)
    send_batch = awaiting(MessagePlans.send_batch)
    get = awaiting(MessagePlans.get)
    list = awaiting(MessagePlans.list)
    cancel = awaiting(MessagePlans.cancel)

    async def iter(
        self,
        *,
        status: MessageStatus | None = None,
        to: str | None = None,
        limit: int | None = None,
        page_size: int = MAX_PAGE_SIZE,
    ) -> AsyncIterator[Message]:
        """Every message, newest first (at most `limit` of them; None: all), fetched
        `page_size` (1 to 100) per request."""
        paging = Paging(limit, page_size)
        while (wanted := paging.next_page_size()) is not None:
            page = await self.list(status=status, to=to, limit=wanted, cursor=paging.cursor)
            for message in paging.taken(page):
                yield message


class Verifications(_BlockingResource):
    start = blocking(VerificationPlans.start)
    get = blocking(VerificationPlans.get)
    confirm = blocking(VerificationPlans.confirm)
    resend = blocking(VerificationPlans.resend)


class AsyncVerifications(_AwaitingResource):
    start = awaiting(VerificationPlans.start)
    get = awaiting(VerificationPlans.get)
    confirm = awaiting(VerificationPlans.confirm)
    resend = awaiting(VerificationPlans.resend)


class _Client:
    """What both clients check and keep: the core, and whether the http client is theirs."""

    def __init__(
        self, base_url: str, api_key: str, retry: RetryPolicy, given: object, transport: object
    ) -> None:
        if given is not None and transport is not None:
            raise ValueError("give http_client or transport, not both")
        self._core = Core(base_url, api_key, retry)
        self._owns_http = given is None

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}({self._core.base_url!r})"


class Client(_Client):
    """The mailbag HTTP API, blocking. `base_url` is where `mailbag api` listens,
    `api_key` a tenant's key. Give `http_client` (e.g. with event hooks or a proxy) or
    only a `transport`; a client made here is closed by `close()` / leaving `with`.

        with Client("http://127.0.0.1:8025", api_key) as mailbag:
            message = mailbag.messages.send("ada@example.com", template="welcome")
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy = DEFAULT_RETRY,
        http_client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, retry, http_client, transport)
        self._http = http_client or httpx.Client(transport=transport, timeout=timeout)
        driver = Blocking(self._http, timeout, time.sleep)
        self.messages = Messages(driver, MessagePlans(self._core))
        self.verifications = Verifications(driver, VerificationPlans(self._core))

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClient(_Client):
    """As Client, for asyncio: every operation is awaited.

    async with AsyncClient("http://127.0.0.1:8025", api_key) as mailbag:
        message = await mailbag.messages.send("ada@example.com", template="welcome")
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy = DEFAULT_RETRY,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, retry, http_client, transport)
        self._http = http_client or httpx.AsyncClient(transport=transport, timeout=timeout)
        driver = Awaiting(self._http, timeout, asyncio.sleep)
        self.messages = AsyncMessages(driver, MessagePlans(self._core))
        self.verifications = AsyncVerifications(driver, VerificationPlans(self._core))

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()
