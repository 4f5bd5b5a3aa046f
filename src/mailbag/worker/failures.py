"""How the worker meets failure: which errors mean "the database is away, wait and try
again" (`DB_ERRORS`), how long to wait (`Backoff`), and what `Worker.run` raises when one
of its side tasks died (`WorkerFailed`).

Anything that is not a `DB_ERRORS` is a bug: it is never retried, it ends the task it
happened in, and a side task that ends stops the worker (see supervisor.py).
"""

from __future__ import annotations

from sqlalchemy.exc import SQLAlchemyError

DB_ERRORS = (SQLAlchemyError, OSError)  # OSError includes TimeoutError (DatabaseTimeout)


class WorkerFailed(RuntimeError):
    """A side task died and the worker stopped: restart the process."""


class Backoff:
    """Exponential delays between a first step and a cap, reset by a success."""

    def __init__(self, first: float, cap: float) -> None:
        self.first, self.cap, self.failures = first, cap, 0

    def next(self) -> float:
        delay = min(self.cap, self.first * float(2**self.failures))
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
