"""In-process wake-ups: an enqueue in this process wakes this process's worker at commit.

PostgreSQL wakes workers in every process with NOTIFY; SQLite has no such thing, so
`mailbag serve` (API and worker in one process) uses this instead of waiting for a poll.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, event

_listeners: list[Callable[[], None]] = []


def subscribe(listener: Callable[[], None]) -> Callable[[], None]:
    _listeners.append(listener)
    return lambda: _listeners.remove(listener)


def notify() -> None:
    for listener in list(_listeners):
        listener()


def notify_after_commit(connection: Connection) -> None:
    """Wake listeners once the caller's transaction commits (not before: nothing to claim)."""
    if _listeners and not connection.info.get("mailbag_wakeup"):
        connection.info["mailbag_wakeup"] = True

        def _after_commit(_conn: Any) -> None:
            connection.info.pop("mailbag_wakeup", None)
            notify()

        def _after_rollback(_conn: Any) -> None:
            connection.info.pop("mailbag_wakeup", None)
            if event.contains(connection, "commit", _after_commit):
                event.remove(connection, "commit", _after_commit)

        event.listen(connection, "commit", _after_commit, once=True)
        event.listen(connection, "rollback", _after_rollback, once=True)
