"""A tenant's endpoint (a URL and the events it wants) and the rules its fields follow:
the URL's (urls.py), the events named, the description; and how the subscribed
events are stored. Pure: no I/O."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from mailbag.domain.hooks.events import ALL_EVENTS, HookEvent
from mailbag.domain.hooks.urls import Policy, UnsafeUrl
from mailbag.domain.hooks.urls import check as check_destination

T = TypeVar("T")
DESCRIPTION_MAX = 500


class InvalidHook(ValueError):
    """An endpoint the rules refuse; `errors` maps each field to what is wrong (a 422)."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{field}: {problem}" for field, problem in self.errors.items()))


@dataclass(frozen=True)
class HookEndpoint:
    """Where a tenant's events go. The secret is not here: it is shown once (create,
    rotate) and stored encrypted."""

    id: uuid.UUID
    tenant_id: str
    url: str
    events: frozenset[HookEvent]
    enabled: bool
    description: str | None
    created_at: datetime
    updated_at: datetime

    def wants(self, event: HookEvent) -> bool:
        return self.enabled and event in self.events


def parse_events(names: Iterable[str]) -> frozenset[HookEvent]:
    """The events named, as `message.sent` or `sent`; `*` means all of them. InvalidHook
    names the unknown ones; an empty selection is refused (it would never fire)."""
    chosen: set[HookEvent] = set()
    unknown: list[str] = []
    by_name = {e.value: e for e in HookEvent} | {e.short: e for e in HookEvent}
    for name in names:
        text = name.strip().lower()
        if text == "*":
            chosen |= ALL_EVENTS
        elif text in by_name:
            chosen.add(by_name[text])
        else:
            unknown.append(name)
    if unknown:
        known = ", ".join(e.short for e in HookEvent)
        raise InvalidHook({"events": f"unknown event(s) {', '.join(unknown)}; known: {known}"})
    if not chosen:
        raise InvalidHook({"events": "name at least one event"})
    return frozenset(chosen)


def events_column(events: Iterable[HookEvent]) -> str:
    """How an endpoint's events are stored: `,sent,bounced,` (each name between commas),
    so that the fan-out's `LIKE '%,sent,%'` matches whole names only."""
    return "," + ",".join(sorted(e.short for e in events)) + ","


def events_from_column(value: str) -> frozenset[HookEvent]:
    return frozenset(HookEvent(f"message.{name}") for name in value.strip(",").split(",") if name)


def check_url(url: str, policy: Policy = Policy()) -> str:
    """The URL (stripped) if hooks may be sent to it under `policy` (domain/hooks/urls.py
    has the rule); else InvalidHook."""
    try:
        check_destination(url, policy)
    except UnsafeUrl as exc:
        raise InvalidHook({"url": str(exc)}) from None
    return url.strip()


def check_description(description: str | None) -> str | None:
    if description is None or not description.strip():
        return None
    if len(description) > DESCRIPTION_MAX:
        raise InvalidHook({"description": f"must be at most {DESCRIPTION_MAX} characters"})
    return description.strip()


@dataclass(frozen=True)
class EndpointFields:
    """An endpoint's checked fields (`check_endpoint`)."""

    url: str | None
    events: frozenset[HookEvent] | None
    description: str | None


def check_endpoint(
    *,
    url: str | None,
    events: Iterable[str] | None,
    description: str | None,
    policy: Policy,
) -> EndpointFields:
    """Check every field given (None: not given, as in an update); InvalidHook names every
    field that is wrong at once, not only the first."""
    errors: dict[str, str] = {}

    def checked(check: Callable[[], T]) -> T | None:
        try:
            return check()
        except InvalidHook as exc:
            errors.update(exc.errors)
            return None

    fields = EndpointFields(
        url=checked(lambda: check_url(url, policy)) if url is not None else None,
        events=checked(lambda: parse_events(events)) if events is not None else None,
        description=checked(lambda: check_description(description)),
    )
    if errors:
        raise InvalidHook(errors)
    return fields
