"""The transition engine without a database: the machines, and the SQL the store derives
from them (guard, target, history), checked on the statements production runs."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import pytest
from sqlalchemy import true
from sqlalchemy.dialects import mysql, postgresql, sqlite

from mailbag.database_url import Dialect
from mailbag.domain.machine import Counted, Machine, Transition
from mailbag.domain.states import MESSAGES, Action
from mailbag.domain.verification import VERIFICATIONS, VAction
from mailbag.store.message_transitions import MESSAGE_ROWS
from mailbag.store.plan import Plan, Step, answering
from mailbag.store.transition import EventSpec, apply_transition
from mailbag.store.verifications import VERIFICATION_ROWS

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
DIALECTS = {
    "postgresql": postgresql.dialect(),
    "mysql": mysql.dialect(),
    "sqlite": sqlite.dialect(),
}


class Light(StrEnum):
    OFF = "off"
    ON = "on"
    BROKEN = "broken"


class Press(StrEnum):
    INSTALL = "install"
    TOGGLE = "toggle"
    BREAK = "break"


TOY = Machine(
    (
        Transition(None, Press.INSTALL, Light.OFF),
        Transition(Light.OFF, Press.TOGGLE, Light.ON),
        Transition(Light.ON, Press.TOGGLE, Light.OFF),
        Transition(Light.ON, Press.BREAK, Light.BROKEN, when=Counted("uses", positive=True)),
        Transition(Light.ON, Press.BREAK, Light.ON, when=Counted("uses", positive=False)),
    )
)


def test_a_machine_answers_from_its_table_alone():
    assert TOY.sources(Press.TOGGLE) == {Light.OFF, Light.ON}
    assert TOY.sources(Press.INSTALL) == frozenset()  # creation has no source state
    assert TOY.target(Press.INSTALL) is Light.OFF
    assert TOY.targets(Press.BREAK) == {Light.BROKEN, Light.ON}
    assert TOY.is_allowed(Light.OFF, Press.TOGGLE, Light.ON)
    assert not TOY.is_allowed(Light.OFF, Press.BREAK, Light.BROKEN)
    assert TOY.can_move(None, Light.OFF) and not TOY.can_move(Light.BROKEN, Light.ON)


def test_an_action_with_conditions_picks_its_target_from_the_row():
    assert TOY.target_for(Press.BREAK, {"uses": 3}) is Light.BROKEN
    assert TOY.target_for(Press.BREAK, {"uses": 0}) is Light.ON
    with pytest.raises(ValueError):  # two targets and no condition says which: no answer
        TOY.target(Press.TOGGLE)


def _sql(element: Any, dialect: str = "sqlite") -> str:
    return str(element.compile(dialect=DIALECTS[dialect], compile_kwargs={"literal_binds": True}))


@pytest.mark.parametrize("action", [a for a in Action if MESSAGES.sources(a)])
def test_the_store_guards_and_targets_each_message_action_as_the_table_says(action):
    guard = _sql(MESSAGE_ROWS.in_states(MESSAGES.sources(action)))
    assert sorted(guard.split("IN (")[1].rstrip(")").replace("'", "").split(", ")) == sorted(
        MESSAGES.sources(action)
    )
    target = _sql(MESSAGE_ROWS.target_sql(action))
    if not MESSAGES.choices(action):
        assert target == f"'{MESSAGES.target(action)}'"


@pytest.mark.parametrize("attempts", [0, 1, 5])
def test_the_release_case_the_store_runs_lands_where_the_domain_says(attempts):
    """The SQL CASE is evaluated by SQLite itself on a row, and compared with the domain."""
    case_sql = _sql(MESSAGE_ROWS.target_sql(Action.RELEASE)).replace(
        "outbox_messages.attempt_count", "attempt_count"
    )
    with sqlite3.connect(":memory:") as conn:
        (landed,) = conn.execute(f"SELECT {case_sql} FROM (SELECT ? AS attempt_count)", [attempts])
    assert landed[0] == MESSAGES.target_for(Action.RELEASE, {"attempt_count": attempts})


@pytest.mark.parametrize("action", [a for a in VAction if VERIFICATIONS.sources(a)])
def test_the_store_targets_each_verification_action_from_its_table(action):
    assert _sql(VERIFICATION_ROWS.target_sql(action)) == f"'{VERIFICATIONS.target(action)}'"


class FakeRow:
    """A result row: attribute access and `_mapping`, as SQLAlchemy's Row offers."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)
        self._mapping = values


class FakeResult:
    def __init__(self, rows: Sequence[FakeRow]) -> None:
        self.rows = list(rows)

    def all(self) -> list[FakeRow]:
        return self.rows


def drive(
    dialect: Dialect, plan: Plan[Any], answers: Sequence[Sequence[FakeRow]]
) -> tuple[list[Step], Any]:
    """Run a plan on `dialect` with canned results; return the steps it yielded and its answer."""
    steps: list[Step] = []
    pending = list(answers)
    sql = answering(plan, dialect)
    try:
        step = next(sql)
        while True:
            steps.append(step)
            step = sql.send(FakeResult(pending.pop(0) if pending else []))  # type: ignore[arg-type]
    except StopIteration as done:
        return steps, done.value


def test_a_message_move_on_sqlite_is_select_update_returning_then_one_history_insert():
    mid = uuid.uuid4()
    moved = FakeRow(
        id=mid, status="retrying", attempt_count=2, provider_message_id=None, last_error="boom"
    )
    steps, changed = drive(
        "sqlite",
        apply_transition(
            MESSAGE_ROWS,
            Action.RELEASE,
            where=true(),
            values={},
            now=NOW,
            actor="w" * 300,
            event=EventSpec(offset=1, column="last_error", prefix="[", suffix="]"),
        ),
        [[FakeRow(id=mid, previous_state="processing")], [moved]],
    )
    select_sql, update_sql = _sql(steps[0].statement), _sql(steps[1].statement)
    assert "outbox_messages.status IN ('processing')" in select_sql
    assert "CASE WHEN" in update_sql and "RETURNING" in update_sql
    assert changed == [(moved, "processing")]
    (history,) = steps[2].params  # type: ignore[misc]
    assert history == {
        "message_id": mid,
        "from_status": "processing",
        "to_status": "retrying",
        "at": NOW,
        "actor": "w" * 200,
        "attempt": 3,
        "provider_message_id": None,
        "detail": "[boom]",
    }


def test_a_verification_move_records_its_current_message():
    vid, mid = uuid.uuid4(), uuid.uuid4()
    steps, _ = drive(
        "mysql",
        apply_transition(
            VERIFICATION_ROWS,
            VAction.CONFIRM,
            where=true(),
            values={"verified_at": NOW},
            now=NOW,
            actor="api",
            event=EventSpec(text="confirmed"),
        ),
        [
            [FakeRow(id=vid, previous_state="sent")],
            [],
            [FakeRow(id=vid, state="verified", message_id=mid)],
        ],
    )
    locking, update_sql = _sql(steps[0].statement, "mysql"), _sql(steps[1].statement, "mysql")
    assert "FOR UPDATE" in locking
    assert "state IN ('send_failed', 'send_pending', 'sent')" in locking
    assert "state='verified'" in update_sql.replace(" = ", "=")
    assert steps[3].params == [
        {
            "verification_id": vid,
            "from_state": "sent",
            "to_state": "verified",
            "at": NOW,
            "actor": "api",
            "detail": "confirmed",
            "message_id": mid,
        }
    ]


def test_on_postgresql_the_move_and_its_history_are_one_statement():
    steps, _ = drive(
        "postgresql",
        apply_transition(
            MESSAGE_ROWS,
            Action.MARK_SENT,
            where=true(),
            values={},
            now=NOW,
            actor="w",
        ),
        [[]],
    )
    (only,) = steps
    text = _sql(only.statement, "postgresql")
    assert "FOR UPDATE" in text and "INSERT INTO message_events" in text
    assert "status='sent'" in text.replace(" = ", "=")
