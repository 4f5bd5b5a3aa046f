"""Lengths of time as people write them: `30d`, `12h`, `90m`, `45s` (the CLI's --expires-in
and `purge --older-than`, and settings such as QUEUE_LIFETIME). Pure: no I/O."""

from __future__ import annotations

from datetime import timedelta

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse(text: str) -> timedelta:
    """`12h` as a timedelta; ValueError for anything but a whole number and one unit."""
    number, unit = text.strip()[:-1], text.strip()[-1:]
    if unit not in UNITS or not number.isdigit():
        raise ValueError(f"{text!r} is not a length of time like 30d, 12h, 90m or 45s")
    return timedelta(seconds=int(number) * UNITS[unit])
