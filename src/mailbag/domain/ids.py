"""Message ids: UUIDv7 (RFC 9562), time-ordered so new rows land at the end of every index.

Within one process ids are also strictly increasing (RFC 9562, 6.2, method 2: a clock that
has not moved on makes the next id the last one plus one), so messages enqueued in the same
millisecond keep their order when the claim breaks ties by id.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_VERSION_AND_VARIANT = (0x7 << 76) | (0x2 << 62)
_FIXED_BITS = (0xF << 76) | (0x3 << 62)
_lock = threading.Lock()
_last = 0


def uuid7(unix_ms: int | None = None) -> uuid.UUID:
    global _last
    ms = time.time_ns() // 1_000_000 if unix_ms is None else unix_ms
    rand = int.from_bytes(os.urandom(10), "big") >> 2  # leave room to count up
    candidate = ((ms & 0xFFFF_FFFF_FFFF) << 80 | rand) & ~_FIXED_BITS | _VERSION_AND_VARIANT
    with _lock:
        if candidate <= _last:
            candidate = _next_after(_last)
        _last = candidate
    return uuid.UUID(int=candidate)


def _next_after(value: int) -> int:
    """The smallest valid v7 value above `value` (skipping the fixed version/variant bits)."""
    nxt = value + 1
    if nxt & _FIXED_BITS != _VERSION_AND_VARIANT:
        nxt = ((nxt | _FIXED_BITS) + 1) & ~_FIXED_BITS | _VERSION_AND_VARIANT
        while nxt & _FIXED_BITS != _VERSION_AND_VARIANT:  # pragma: no cover - astronomically rare
            nxt = (nxt + 1) & ~_FIXED_BITS | _VERSION_AND_VARIANT
    return nxt
