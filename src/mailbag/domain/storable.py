"""What every supported database can store, checked before anything is written.

A value that passes request validation but that the database then refuses would answer
500 after a partial write and put the request's data into the error. The rules:

- text is valid Unicode that UTF-8 can carry (no lone surrogates, which JSON's `\\ud800`
  escapes can smuggle in) and holds no NUL: PostgreSQL refuses U+0000 in text and JSONB;
- JSON (template data, metadata) nests at most MAX_JSON_DEPTH containers deep: MariaDB
  refuses documents deeper than 31 levels, and pydantic refuses to serialize beyond 255,
  which made every later read of such a row fail;
- a time converts to UTC without overflow and lies within the years 1000 to 9999 UTC,
  the range of MariaDB's DATETIME (the narrowest of the three).

`problem(value)` walks any value built from JSON (dicts, lists, strings, numbers) and
datetimes, and names the first rule it breaks, without quoting the value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

MAX_JSON_DEPTH = 16
EARLIEST = datetime(1000, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)


class Unstorable(ValueError):
    """A value no database can hold as given; `kind` names the rule it breaks."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


def text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains U+0000 (NUL), which cannot be stored"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (an unpaired \\ud800-\\udfff escape), not Unicode text"
    return None


def time_problem(when: datetime) -> str | None:
    if when.tzinfo is None:
        return None  # a naive time is refused by the message rules, with their own words
    out_of_range = "must lie between the years 1000 and 9999 once converted to UTC"
    try:
        utc = when.astimezone(UTC)  # year 1 at +01:00 or 9999 at -01:00 overflows here
    except OverflowError:
        return out_of_range
    return None if EARLIEST <= utc <= LATEST else out_of_range


def check(value: object, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise Unstorable if `value`, or anything inside it, breaks a rule above."""
    # Iterative, so a hostile nesting depth cannot exhaust the stack.
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            if (problem := text_problem(item)) is not None:
                raise Unstorable("unstorable_text", problem)
        elif isinstance(item, datetime):
            if (problem := time_problem(item)) is not None:
                raise Unstorable("unstorable_time", problem)
        elif isinstance(item, dict | list | tuple):
            if depth + 1 > max_depth:
                raise Unstorable("too_deep", f"is nested more than {max_depth} levels deep")
            if isinstance(item, dict):
                for key, inner in item.items():
                    pending.append((key, depth + 1))
                    pending.append((inner, depth + 1))
            else:
                pending.extend((inner, depth + 1) for inner in item)


def json_object(
    name: str, value: Mapping[str, Any] | None, errors: dict[str, str], max_bytes: int
) -> dict[str, Any]:
    """`value` as the plain JSON object the database hands back, or {} with the problem
    put into `errors` under `name`: not an object, unstorable, not JSON, too large."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errors[name] = "must be a JSON object"
        return {}
    try:  # first, and iterative: json.dumps itself recurses as deep as the value nests
        check(value)
    except Unstorable as exc:
        errors[name] = str(exc)
        return {}
    try:
        encoded = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        errors[name] = f"is not JSON-serializable: {exc}"
        return {}
    if len(encoded.encode()) > max_bytes:
        errors[name] = f"is larger than {max_bytes} bytes as JSON"
        return {}
    # A round trip gives the plain JSON types the database will hand back.
    decoded: dict[str, Any] = json.loads(encoded)
    return decoded
