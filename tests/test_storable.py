"""The storable-value rule on its own: its edges, without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from mailbag.domain import storable


def nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        "Zoë 😀 \U0001f4e7",  # astral characters are fine: only *lone* surrogates are not
        "tab\tand\nnewline",  # line breaks are a header rule, not a storage one
        {"a": [1, 2.5, None, True, {"b": "c"}]},
        nested(storable.MAX_JSON_DEPTH),
        datetime(1000, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 22, 59, tzinfo=timezone(timedelta(hours=-1))),
        datetime(1, 1, 1),  # naive: the message rules refuse it in their own words
    ],
)
def test_storable_values_pass(value):
    storable.check(value)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("a\x00b", "unstorable_text"),
        ("\ud800", "unstorable_text"),
        ("\udfff tail", "unstorable_text"),
        ({"key\x00": 1}, "unstorable_text"),
        ({"ok": ["x", {"\ud83d": 1}]}, "unstorable_text"),
        (nested(storable.MAX_JSON_DEPTH + 1), "too_deep"),
        (datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))), "unstorable_time"),
        (datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-1))), "unstorable_time"),
        (datetime(999, 12, 31, 23, 59, tzinfo=UTC), "unstorable_time"),
    ],
)
def test_unstorable_values_are_named(value, kind):
    with pytest.raises(storable.Unstorable) as caught:
        storable.check(value)
    assert caught.value.kind == kind


def test_a_hostile_depth_is_refused_without_recursion():
    value: object = "leaf"
    for _ in range(100_000):
        value = [value]
    with pytest.raises(storable.Unstorable):
        storable.check(value)
