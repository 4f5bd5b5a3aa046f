"""Fields of provider webhook events made safe to store: shared by the event parsers.

A provider's event is stored as it came (its raw JSON) next to a few columns read from it.
Whatever an event holds, storing it must not fail: every database refuses something (the
rules of `mailbag.domain.storable`, plus values longer than a column and NaN in jsonb). A
failed insert would answer 500 and the provider would retry the whole batch. An API
request that breaks them is refused, as its client can fix it; a provider cannot send its
event any other way, so here each column gets a value it accepts and the raw JSON a copy
every database stores: what cannot be stored is replaced, not refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from mailbag.domain import storable

RAW_DEPTH: Final = storable.MAX_JSON_DEPTH  # deeper than any provider nests
_TOO_DEEP: Final = "(nested too deep; dropped)"
_LARGEST_INT: Final = 2**63 - 1  # beyond it MariaDB's JSON turns numbers into doubles


def clean(text: str) -> str:
    """The text with NUL and lone surrogates replaced by U+FFFD (the replacement character)."""
    if storable.text_problem(text) is None:
        return text
    return "".join(
        "\ufffd" if char == "\x00" or "\ud800" <= char <= "\udfff" else char for char in text
    )


def text(value: object, limit: int) -> str | None:
    """A non-empty string field, stripped and cleaned, cut to `limit` characters (a detail:
    its start is what a person reads)."""
    if not isinstance(value, str) or not value.strip():
        return None
    return clean(value.strip())[:limit]


def identifier(value: object, limit: int) -> str | None:
    """Like `text`, but a value longer than `limit` is no identifier we could ever match
    (our column holds `limit` characters): None rather than a cut one that matches another."""
    found = text(value, limit + 1)
    return found if found is not None and len(found) <= limit else None


def raw_json(value: Any, depth: int = 0) -> Any:
    """A copy of decoded JSON that every database stores: strings cleaned, non-finite
    numbers as null, integers beyond 64 bits as strings, nesting cut at RAW_DEPTH."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -_LARGEST_INT <= value <= _LARGEST_INT else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth >= RAW_DEPTH:
        return _TOO_DEEP
    if isinstance(value, Mapping):
        return {clean(str(k)): raw_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [raw_json(item, depth + 1) for item in value]
    return clean(str(value))


def storable_time(moment: datetime) -> datetime:
    """The event time, if every database can store it (ValueError otherwise)."""
    if (problem := storable.time_problem(moment)) is not None:
        raise ValueError(f"the event time {problem}")
    return moment
