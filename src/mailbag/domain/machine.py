"""A state machine as one table of data: which action moves a row from which state to which.

mailbag has two (outbox messages in domain/states.py, verifications in
domain/verification.py); both are a `Machine` over their own states and actions. The store
derives everything it writes from the machine and nothing else: the guard of each
conditional UPDATE (`sources`), the state the row lands in (`target`, or for an action whose
target depends on the row, one `CASE` built from the transitions' `when`), so the tests
that check the machine check what production runs.

A transition's `when` is a test of the row as it was before the move, written as data so
that Python (`target_for`) and SQL (the store) read the same declaration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

S = TypeVar("S", bound=StrEnum)
A = TypeVar("A", bound=StrEnum)


@dataclass(frozen=True)
class Counted:
    """`column > 0` when `positive`, else `column = 0` (counts never go below zero)."""

    column: str
    positive: bool

    def holds(self, row: Mapping[str, Any]) -> bool:
        return (row[self.column] > 0) is self.positive


@dataclass(frozen=True)
class Budget:
    """`count + 1 >= budget` when `spent` (the attempt being closed is the last one the
    budget allows), else `count + 1 < budget`."""

    count: str
    budget: str
    spent: bool

    def holds(self, row: Mapping[str, Any]) -> bool:
        return (row[self.count] + 1 >= row[self.budget]) is self.spent


Condition = Counted | Budget


@dataclass(frozen=True)
class Transition(Generic[S, A]):
    source: S | None  # None: the row is being created
    action: A
    target: S
    when: Condition | None = None  # for an action with several targets: which one applies


def from_each(sources: Iterable[S], action: A, target: S) -> tuple[Transition[S, A], ...]:
    """One transition per source, in order: `action` moves each of `sources` alike to
    `target` (a row of the table written once for the states that share it)."""
    return tuple(Transition(source, action, target) for source in sources)


class Machine(Generic[S, A]):
    """The transitions of one kind of row, and the questions the store and tests ask of them."""

    def __init__(self, transitions: Iterable[Transition[S, A]]) -> None:
        self.transitions: tuple[Transition[S, A], ...] = tuple(transitions)
        # Asked for each row written (enqueue's ENQUEUE, each outcome): answered once.
        self._targets: dict[A, frozenset[S]] = {}

    def sources(self, action: A) -> frozenset[S]:
        """The states an action may start from: the guard of its conditional UPDATE."""
        return frozenset(
            t.source for t in self.transitions if t.action is action and t.source is not None
        )

    def targets(self, action: A) -> frozenset[S]:
        if (known := self._targets.get(action)) is None:
            known = frozenset(t.target for t in self.transitions if t.action is action)
            self._targets[action] = known
        return known

    def target(self, action: A) -> S:
        """The single state an action leads to (an action with a `when` has none)."""
        (only,) = self.targets(action)
        return only

    def choices(self, action: A) -> list[tuple[Condition, S]]:
        """An action's targets that depend on the row, each with its condition; [] if it has
        a single target."""
        return sorted(
            {(t.when, t.target) for t in self.transitions if t.action is action and t.when},
            key=lambda choice: repr(choice[0]),
        )

    def target_for(self, action: A, row: Mapping[str, Any]) -> S:
        """Where `action` takes this row (as it was before the move)."""
        for condition, state in self.choices(action):
            if condition.holds(row):
                return state
        return self.target(action)

    def is_allowed(self, source: S | None, action: A, target: S) -> bool:
        return any(
            (t.source, t.action, t.target) == (source, action, target) for t in self.transitions
        )

    def can_move(self, source: S | None, target: S) -> bool:
        """Whether any action moves a row from source to target."""
        return any(t.source == source and t.target == target for t in self.transitions)
