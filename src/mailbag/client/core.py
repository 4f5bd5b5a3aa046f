"""The client's logic, written once for the sync and the async client: without I/O.

A call is a plan: a generator that yields steps (`Send` this request, `Wait` this long) and
is sent back what each step gave (the response, or the transport error in its stead). The
plan builds the requests, applies the retry policy and maps error answers to exceptions; a
driver (client/clients.py: one blocking, one async) only performs the steps. So the two
clients cannot drift apart, and a plan is tested by feeding it responses.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from mailbag.client.errors import ConnectionFailed, describe, error_for
from mailbag.client.retry import Outcome, RetryPolicy

T = TypeVar("T")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mailbag")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


USER_AGENT = f"mailbag-client/{_version()}"


@dataclass(frozen=True)
class Send:
    """Perform this request (the driver's http client adds its own defaults)."""

    method: str
    url: str
    headers: dict[str, str]
    json: Any = None
    params: dict[str, str | int] = field(default_factory=dict)


@dataclass(frozen=True)
class Wait:
    seconds: float


Step = Send | Wait
# What the driver sends back: the outcome of a Send, None after a Wait.
Plan = Generator[Step, Outcome | None, T]


def new_idempotency_key() -> str:
    return str(uuid.uuid4())


class Core:
    """What both clients share: where the API is, the credentials, the retry policy."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        retry: RetryPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not api_key:
            raise ValueError("an API key is required (mailbag tenants create prints one)")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._authorization = f"Bearer {api_key}"
        self.retry = retry
        self.clock = clock
        self.rng = rng

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str | int] | None = None,
        idempotency_key: str | None = None,
    ) -> Plan[httpx.Response]:
        """One logical call, retried by the policy: the successful response, else raises
        the error of the last attempt. Every attempt carries the same Idempotency-Key."""
        headers = {"Authorization": self._authorization, "User-Agent": USER_AGENT}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        request = Send(method, self.base_url + path, headers, json, params or {})
        began = self.clock()
        attempt = 0
        while True:
            attempt += 1
            outcome = yield request
            if isinstance(outcome, httpx.Response) and outcome.is_success:
                return outcome
            assert outcome is not None  # a Send is always answered
            wait = self.retry.wait(attempt, outcome, self.clock() - began, self.rng)
            if wait is None:
                if isinstance(outcome, httpx.Response):
                    raise error_for(outcome, attempt)
                raise ConnectionFailed(
                    f"no answer from {self.base_url} after {attempt} attempt(s): "
                    f"{describe(outcome)}",
                    attempt,
                ) from outcome
            yield Wait(wait)

    def __repr__(self) -> str:  # never the key
        return f"Core({self.base_url!r})"
