"""Chains: checks, then writes, each statement built once and run one by one or combined.

A chain is what the common case of a keyed request writes (store/first_use.py): checks that
must all hold, then writes that each happen only if the one before it wrote, and a NOTIFY
for the workers once they all did. It is declared once, as data (a Check is a condition
over named parameters, a Write the rows one table receives), and every statement is built
from that declaration once per database, so the two ways to run it are one plan:

- one by one (every database): any lock the caller puts first (`before`), each check as a
  SELECT of its own, stopping at the first that fails, then each write in turn;
- combined (PostgreSQL): the lock, then the same checks and writes as ONE statement of
  data-modifying CTEs, each write's rows selected only if the one before it wrote:

      WITH allowed AS (SELECT 1 WHERE <check> AND <check> ...),
      <write> AS (INSERT INTO ... SELECT <its row> WHERE EXISTS (SELECT 1 FROM allowed)
                  [ON CONFLICT ...] RETURNING 1),
      <next write> AS (INSERT ... WHERE EXISTS (SELECT 1 FROM <write>) RETURNING 1), ...
      SELECT (SELECT count(*) FROM <write>) AS <write>, ...,
             (SELECT pg_notify(...) FROM <last write>) AS notified

  sent together with the lock (store.plan.together): one round trip. Each statement of a
  READ COMMITTED transaction sees what was committed before it began, so the statement
  after the lock sees everything the lock's previous holder wrote.

Only the first write may write nothing without an error (a taken key, `may_skip`), so a
chain that stops has written nothing; any other write that cannot be made (a unique index)
raises, and the caller's transaction, or the one statement, writes nothing either. A row's
values are parameters named after the write and the column (`record_tenant_id`;
`moves_2_to_state` for the second of several rows). A session whose engine carries
STEP_BY_STEP runs chains one by one on PostgreSQL too (tests/test_fast_paths.py writes the
same input both ways and compares the rows), and one carrying WITHOUT_CHAINS runs none
(every request then takes the general path, which the tests compare too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Executable,
    Insert,
    Result,
    Select,
    Table,
    and_,
    bindparam,
    func,
    insert,
    literal_column,
    select,
    union_all,
)

from mailbag.database_url import Dialect
from mailbag.store.plan import Plan, Step, connection_option, current_dialect, together

# Execution options (engine.execution_options(**STEP_BY_STEP)) that tests run chains by.
STEP_BY_STEP_OPTION = "mailbag_step_by_step"
STEP_BY_STEP = {STEP_BY_STEP_OPTION: True}
WITHOUT_CHAINS_OPTION = "mailbag_without_chains"
WITHOUT_CHAINS = {WITHOUT_CHAINS_OPTION: True}


@dataclass(frozen=True, eq=False)
class Check:
    """A condition every write of the chain needs, over named parameters (`bindparam`)."""

    name: str
    holds: ColumnElement[bool]


@dataclass(frozen=True, eq=False)
class Write:
    """The rows one table receives: `rows` rows of `columns` (the row's other columns must
    be None: the table's defaults). `insert(dialect)` makes the dialect's INSERT, with what
    it does about a taken key; `may_skip`: it can write nothing without an error."""

    name: str
    table: Table
    columns: tuple[str, ...]
    rows: int = 1
    insert: Callable[[Dialect], Insert] | None = None
    may_skip: bool = False

    @cached_property
    def left_out(self) -> tuple[str, ...]:
        """The table's columns this write leaves to their defaults (NULL)."""
        return tuple(c.name for c in self.table.columns if c.name not in self.columns)

    @cached_property
    def bind_names(self) -> tuple[tuple[str, ...], ...]:
        """Each row's parameter names, in the order of `columns`."""
        return tuple(tuple(self.bind_name(c, n) for c in self.columns) for n in range(self.rows))

    def bind_name(self, column: str, n: int) -> str:
        return f"{self.name}_{column}" if self.rows == 1 else f"{self.name}_{n + 1}_{column}"

    def binds(self, n: int) -> dict[str, BindParameter[Any]]:
        c = self.table.c
        return {
            name: bindparam(self.bind_name(name, n), type_=c[name].type) for name in self.columns
        }

    def statement(self, dialect: Dialect) -> Insert:
        return self.insert(dialect) if self.insert is not None else insert(self.table)


@dataclass(frozen=True)
class _Steps:
    checks: list[Select[Any]]
    writes: list[Insert]
    notify: Select[Any] | None


@dataclass(frozen=True, eq=False)
class Chain:
    """Checks, then writes, then a NOTIFY: declared once, its statements built on first use
    for each database and kept (`steps`, `combined`); `run` runs it."""

    checks: tuple[Check, ...]
    writes: tuple[Write, ...]
    notify: str | None = None  # a channel to NOTIFY on PostgreSQL once everything is written
    _built: dict[tuple[Dialect, bool], Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # A write that may skip stops the rest: only the first, so a stop writes nothing.
        assert not any(w.may_skip for w in self.writes[1:]), "only the first write may skip"

    def _notify(self) -> ColumnElement[Any]:
        # The channel as a literal, not a parameter: it is mailbag's own constant.
        return func.pg_notify(literal_column(f"'{self.notify}'"), literal_column("''"))

    def params(self, rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
        """Each write's parameters, from the rows it receives (`rows`, by the write's name).
        Apart, not merged: an INSERT run on its own would take a parameter named after a
        column of its table as that column's value."""
        params = []
        for write in self.writes:
            given = rows[write.name]
            if len(given) != write.rows:
                raise ValueError(f"{write.name} takes {write.rows} row(s), not {len(given)}")
            mine: dict[str, Any] = {}
            for names, row in zip(write.bind_names, given, strict=True):
                mine.update(zip(names, map(row.__getitem__, write.columns), strict=True))
                if left := [c for c in write.left_out if row.get(c) is not None]:
                    raise ValueError(f"{write.name} does not write {', '.join(left)}")
            params.append(mine)
        return params

    # --- one by one -------------------------------------------------------------------

    def steps(self, dialect: Dialect) -> _Steps:
        """Each check's SELECT, each write's INSERT and the NOTIFY, run one by one."""
        built = self._built.get((dialect, False))
        if built is None:
            writes = []
            for write in self.writes:
                rows = [write.binds(n) for n in range(write.rows)]
                statement = write.statement(dialect).values(rows if write.rows > 1 else rows[0])
                if write.may_skip and dialect != "mysql":
                    # What it wrote, said by RETURNING: a driver's rowcount is -1 for an
                    # INSERT that SQLAlchemy gives a RETURNING of its own (the new id).
                    statement = statement.returning(literal_column("1"))
                writes.append(statement)
            built = self._built[(dialect, False)] = _Steps(
                checks=[select(check.holds.label(check.name)) for check in self.checks],
                writes=writes,
                notify=(
                    select(self._notify())
                    if self.notify is not None and dialect == "postgresql"
                    else None
                ),
            )
        return built

    # --- combined (PostgreSQL) --------------------------------------------------------

    def combined(self) -> Executable:
        """The whole chain as one statement (see the module docstring)."""
        built = self._built.get(("postgresql", True))
        if built is None:
            built = self._built[("postgresql", True)] = self._combine()
        return built

    def _combine(self) -> Executable:
        one: ColumnElement[Any] = literal_column("1")
        gate: Any = select(one).where(and_(*(c.holds for c in self.checks))).cte("allowed")
        counts, ctes = [], []
        for write in self.writes:
            wrote = select(one).select_from(gate).exists()
            rows = [
                select(*(bind.label(column) for column, bind in write.binds(n).items())).where(
                    wrote
                )
                for n in range(write.rows)
            ]
            source = rows[0] if len(rows) == 1 else union_all(*rows)
            statement = write.statement("postgresql").from_select(list(write.columns), source)
            gate = statement.returning(one).cte(write.name)
            ctes.append(gate)
            counts.append(
                select(func.count()).select_from(gate).scalar_subquery().label(write.name)
            )
        if self.notify is not None:
            notified = select(self._notify()).select_from(gate)
            counts.append(notified.scalar_subquery().label("notified"))
        return select(*counts).add_cte(*ctes)


def run(
    chain: Chain,
    *,
    values: Mapping[str, Any],
    rows: Mapping[str, Sequence[Mapping[str, Any]]],
    before: Sequence[Step] = (),
) -> Plan[bool]:
    """Run `chain` with the checks' parameters `values` and each write's `rows`, after the
    steps `before` (a lock): one by one, or combined on PostgreSQL (see the module
    docstring). True: every check held and every row was written; False: nothing was."""
    dialect = yield from current_dialect()
    if (yield from connection_option(WITHOUT_CHAINS_OPTION)):
        return False
    params = chain.params(rows)
    if dialect == "postgresql" and not (yield from connection_option(STEP_BY_STEP_OPTION)):
        merged = dict(values)
        for mine in params:
            merged.update(mine)
        combined = Step(chain.combined(), merged)
        *_, answer = yield from together(*before, combined, last=True)
        counts = answer.one()
        return all(counts[i] == write.rows for i, write in enumerate(chain.writes))
    for step in before:  # noqa: UP028 - `yield from` a list cannot take the Results sent
        yield step
    steps = chain.steps(dialect)
    for check in steps.checks:
        if not (yield Step(check, values)).scalar_one():
            return False
    for write, statement, mine in zip(chain.writes, steps.writes, params, strict=True):
        written = yield Step(statement, mine)
        if write.may_skip and not _wrote(written, dialect):
            return False
    if steps.notify is not None:
        yield Step(steps.notify)
    return True


def _wrote(result: Result[Any], dialect: Dialect) -> bool:
    """Whether a write that may skip wrote its row: by its RETURNING, or on MariaDB (no
    INSERT ... RETURNING) by its rowcount, which a plain INSERT reports exactly."""
    if dialect == "mysql":
        return bool(result.rowcount)  # type: ignore[attr-defined]
    return result.first() is not None
