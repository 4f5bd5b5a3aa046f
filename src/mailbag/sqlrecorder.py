"""Run a store plan without a database and write down, readably, every statement it issues.

The recorder stands where a connection would: it answers the plan's dialect question,
compiles each statement the plan yields, in order, and answers it with sample rows of the
statement's own columns, so that the plan goes on to its next step as it would on a
database (mailbag.sqldocs picks the samples that make each plan take its longest path).

What it writes is the SQL the driver receives, made readable in three ways and no other:

- Every parameter has a name (`:name`). SQLAlchemy numbers the ones it names itself
  (`param_1` for a literal, `tenant_id_1` for a comparison); here each takes the name of
  the column it is set to, inserted into, compared with or labelled as, and a number only
  where two different values would share one name (`now`, `now_2`). Lists are expanded
  (`:ids_1, :ids_2`) as the driver receives them.
- psycopg receives each PostgreSQL parameter with its type as a cast
  (`:now::TIMESTAMP WITH TIME ZONE`); the casts are left out.
- No line is longer than WIDTH: a long line is cut before its clauses (SET, FROM, WHERE,
  RETURNING...), inside a long parenthesized group, then after commas and before AND/OR,
  and only between words (never inside a quoted literal), so the SQL is unchanged.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Executable
from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql
from sqlalchemy.dialects.postgresql.psycopg import PGCompiler_psycopg, PGDialect_psycopg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Dialect as SQLDialect
from sqlalchemy.sql import visitors
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.elements import BindParameter, Case, ClauseElement, Label, TextClause
from sqlalchemy.sql.selectable import Select, TextualSelect

from mailbag.database_url import Dialect
from mailbag.store.plan import Plan, Step, Together, answering, round_trip

WIDTH = 100
NOW = datetime(2026, 1, 1, tzinfo=UTC)
SAMPLE_ID = uuid.UUID(int=1)
EXECUTEMANY = "-- once per row (executemany)"


class _UncastCompiler(PGCompiler_psycopg):
    """psycopg's compiler without the casts it adds to every parameter."""

    def render_bind_cast(self, type_: Any, dbapi_type: Any, sqltext: str) -> str:
        return sqltext


class _UncastDialect(PGDialect_psycopg):
    statement_compiler = _UncastCompiler


# The drivers mailbag runs on (database_url.py), showing parameters by name.
DIALECTS: dict[Dialect, SQLDialect] = {
    "postgresql": _UncastDialect(paramstyle="named"),  # type: ignore[no-untyped-call]
    "mysql": MySQLDialect_pymysql(paramstyle="named"),
    "sqlite": SQLiteDialect_pysqlite(paramstyle="named"),
}

# A sample value of each column type, where the caller's samples name none.
TYPE_SAMPLES: dict[type, Any] = {
    uuid.UUID: SAMPLE_ID,
    datetime: NOW,
    int: 1,
    float: 1.0,
    bool: False,
    str: "sample",
    dict: {},
    list: [],
}


# --- Sample answers -----------------------------------------------------------------------


class SampleRow(tuple[Any, ...]):
    """A row by position and by name, like SQLAlchemy's Row."""

    _names: tuple[str, ...]

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._names.index(name)]
        except ValueError:
            raise AttributeError(name) from None

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._names, self, strict=True))


def _column_name(column: Any) -> str:
    return str(getattr(column, "key", None) or getattr(column, "name", ""))


def _sample(column: Any, samples: Mapping[str, Any]) -> Any:
    name = _column_name(column)
    if name in samples:
        return samples[name]
    try:
        kind = column.type.python_type
    except NotImplementedError:
        return None
    return TYPE_SAMPLES.get(kind)


def sample_row(columns: Sequence[Any], samples: Mapping[str, Any]) -> SampleRow:
    """A row of these columns: `samples` by column name, else a sample of each one's type."""
    row = SampleRow(_sample(c, samples) for c in columns)
    row._names = tuple(_column_name(c) for c in columns)
    return row


class SampleResult:
    """What a recorded step answers: `count` sample rows of the statement's columns."""

    def __init__(self, statement: Executable, count: int, samples: Mapping[str, Any]) -> None:
        columns = list(getattr(statement, "exported_columns", None) or [])
        self._rows = [sample_row(columns, samples) for _ in range(count)] if columns else []
        self.rowcount = count
        self.inserted_primary_key = (1,)

    def all(self) -> list[SampleRow]:
        return list(self._rows)

    def __iter__(self) -> Iterator[SampleRow]:
        return iter(self._rows)

    def first(self) -> SampleRow | None:
        return self._rows[0] if self._rows else None

    def one(self) -> SampleRow:
        return self._rows[0]

    def scalar_one(self) -> Any:
        return self._rows[0][0]

    def scalars(self) -> SampleResult:
        scalars = SampleResult.__new__(SampleResult)
        scalars._rows = [row[0] for row in self._rows]
        return scalars


def record(
    plan: Plan[Any],
    dialect: Dialect,
    *,
    rows: Sequence[int] = (),
    samples: Mapping[str, Any] | None = None,
) -> list[str]:
    """The statements `plan` runs on `dialect`, readable, in order. `rows` is how many sample
    rows each step is answered with in turn (1 after these); `samples` are column values.
    Steps sent together (store.plan.together) are shown as AsyncDatabase.run_at_once sends
    them: with the BEGIN and COMMIT that go in their round trip (store.plan.round_trip)."""
    steps = answering(plan, dialect)
    counts = iter(rows)
    statements: list[str] = []
    opened = False

    def answered(step: Step) -> SampleResult:
        statements.append(readable(step, dialect))
        return SampleResult(step.statement, next(counts, 1), samples or {})

    try:
        instruction = next(steps)
        while True:
            if isinstance(instruction, Together):
                begin, commit = round_trip(instruction, in_transaction=opened)
                opened = (opened or begin) and not commit
                statements += ["BEGIN;"] if begin else []
                answers = tuple(answered(step) for step in instruction.steps)
                statements += ["COMMIT;"] if commit else []
                instruction = steps.send(answers)  # type: ignore[arg-type]
            else:
                instruction = steps.send(answered(instruction))  # type: ignore[arg-type]
    except StopIteration:
        return statements


# --- Readable SQL -------------------------------------------------------------------------


def readable(step: Step, dialect: Dialect) -> str:
    """A step's statement as the driver receives it: named parameters, wrapped lines."""
    many = isinstance(step.params, Sequence) and not isinstance(step.params, Mapping)
    params = step.params[0] if many and step.params else step.params  # type: ignore[index]
    compiled = step.statement.compile(  # type: ignore[attr-defined]
        dialect=DIALECTS[dialect],
        column_keys=list(params) if params else None,
        for_executemany=many,
        compile_kwargs={"render_postcompile": True},
    )
    sql = _renamed(str(compiled), compiled.bind_names, _context_names(step.statement))
    sql = sql.strip() + ";"
    if not isinstance(step.statement, TextClause | TextualSelect):  # its indents mean nothing
        sql = "\n".join(line.strip() for line in sql.splitlines())
    lines = [wrapped for line in sql.splitlines() for wrapped in wrap(line.rstrip())]
    if many:  # said after the statement, so that it still starts with its first keyword
        fits = len(lines[-1]) + 2 + len(EXECUTEMANY) <= WIDTH
        lines[-1:] = [f"{lines[-1]}  {EXECUTEMANY}"] if fits else [lines[-1], EXECUTEMANY]
    return "\n".join(lines)


def _anonymous(key: Any) -> bool:
    """Whether SQLAlchemy names this parameter itself (its key is `%(<id> <base>)s`)."""
    return isinstance(key, str) and key.startswith("%(") and key.endswith(")s")


def _base(key: str) -> str:
    """The name SQLAlchemy numbers an anonymous parameter by: `param`, `tenant_id`..."""
    return key[2:-2].split(" ", 1)[-1]


def _context_names(statement: Any) -> dict[str, str]:
    """A name for each literal's parameter (SQLAlchemy's `param_N`) from where it stands, by
    its key: the column a CASE compares it with, the label it is selected as, the column it
    sets or inserts. A parameter SQLAlchemy named after a column keeps it."""
    names: dict[str, str] = {}

    def name_within(element: Any, name: str) -> None:
        if isinstance(element, ClauseElement):
            for node in visitors.iterate(element):
                if isinstance(node, BindParameter) and _base(node.key) == "param":
                    names.setdefault(node.key, name)

    nodes = list(visitors.iterate(statement))
    for node in nodes:  # the tightest context first: a CASE's WHEN values
        if isinstance(node, Case) and node.value is not None:
            for condition, _ in node.whens:
                name_within(condition, _column_name(node.value))
    for node in nodes:  # a label of a value, not of a subquery's answer
        if (
            isinstance(node, Label)
            and not _anonymous(node.name)
            and not any(isinstance(inner, Select) for inner in visitors.iterate(node.element))
        ):
            name_within(node.element, node.name)
    for node in nodes:
        if isinstance(node, Insert | Update):
            for column, value in (node._values or {}).items():
                name_within(value, _column_name(column) or str(column))
        if isinstance(node, Insert) and node.select is not None and node._select_names:
            for name, column in zip(node._select_names, node.select.selected_columns, strict=False):
                name_within(column, _column_name(name) or str(name))
    return names


_PARAMETER = re.compile(r"(?<![:\w]):(\w+)")


def _compared_with(sql: str, name: str) -> str | None:
    """What a parameter is in `sql`: LIMIT's or OFFSET's, or the column it is compared with
    or set to (`column = :name`)."""
    parameter = rf":{re.escape(name)}(?!\w)"
    if re.search(rf"\bLIMIT {parameter}, :\w", sql):  # MySQL's LIMIT offset, count
        return "offset"
    if re.search(rf"\bLIMIT :\w+, {parameter}", sql):
        return "limit"
    if found := re.search(rf"\b(LIMIT|OFFSET) {parameter}", sql):
        return found.group(1).lower()
    found = re.search(rf"(\w+) ?(?:=|<>|!=|<=|>=|<|>) ?{parameter}", sql)
    return found.group(1) if found else None


def _renamed(sql: str, bind_names: Mapping[Any, str], context: Mapping[str, str]) -> str:
    """`sql` with each anonymous parameter renamed: after its context, the column it is
    compared with, its base name (`tenant_id` of `tenant_id_1`), or `value`."""
    taken = {name for bind, name in bind_names.items() if not _anonymous(bind.key)}
    renames: dict[str, str] = {}
    expanding: dict[str, str] = {}
    for bind, name in sorted(bind_names.items(), key=lambda item: _first_use(sql, item[1])):
        if not _anonymous(bind.key) or name in renames:
            continue
        wanted = context.get(bind.key) or _base(bind.key)
        if wanted == "param":
            wanted = _compared_with(sql, name) or "value"
        new, n = wanted, 1
        while new in taken:
            n += 1
            new = f"{wanted}_{n}"
        taken.add(new)
        renames[name] = new
        if bind.expanding:
            expanding[name] = new

    def rename(match: re.Match[str]) -> str:
        token = match.group(1)
        if token in renames:
            return f":{renames[token]}"
        stem, _, index = token.rpartition("_")
        if stem in expanding and index.isdigit():  # one item of an expanded list
            return f":{expanding[stem]}_{index}"
        return match.group(0)

    return _PARAMETER.sub(rename, sql)


def _first_use(sql: str, name: str) -> int:
    """Where a parameter first appears, so that numbered names count from left to right."""
    found = re.search(rf"(?<![:\w]):{re.escape(name)}(?!\w)|(?<![:\w]):{re.escape(name)}_\d", sql)
    return found.start() if found else len(sql)


# --- Wrapping -----------------------------------------------------------------------------

# Clauses a long line is cut before, longest first (ON DUPLICATE KEY UPDATE before UPDATE).
CLAUSES = tuple(
    tuple(clause.split())
    for clause in (
        "ON DUPLICATE KEY UPDATE",
        "ON CONFLICT",
        "DO UPDATE SET",
        "FOR UPDATE",
        "FOR NO KEY UPDATE",
        "ORDER BY",
        "GROUP BY",
        "UNION ALL",
        "SELECT",
        "SET",
        "FROM",
        "WHERE",
        "HAVING",
        "RETURNING",
        "VALUES",
        "LIMIT",
    )
)

Word = tuple[str, int, int]  # a word, the parenthesis depth where it starts and where it ends


def words_of(line: str) -> list[Word]:
    """The line's words, split at spaces outside quotes, with their depths."""
    words: list[Word] = []
    current, start, depth, quote = "", 0, 0, ""
    for char in line:
        if not quote and char == " ":
            if current:
                words.append((current, start, depth))
            current = ""
            continue
        if not current:
            start = depth
        current += char
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"`":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
    if current:
        words.append((current, start, depth))
    return words


def wrap(line: str, width: int = WIDTH) -> list[str]:
    """`line` as lines of at most `width` characters where words allow, same SQL."""
    if len(line) <= width:
        return [line]
    indent = line[: len(line) - len(line.lstrip())]
    return _wrap(words_of(line.strip()), indent, width)


def _line(words: Sequence[Word], indent: str) -> str:
    return indent + " ".join(word for word, _, _ in words)


def _wrap(words: list[Word], indent: str, width: int) -> list[str]:
    if len(_line(words, indent)) <= width or len(words) < 2:
        return [_line(words, indent)]
    top = words[0][2]  # the depth the line's first word leaves its content at
    cuts = _clause_cuts(words, top)
    if cuts:
        pieces = [words[a:b] for a, b in zip([0, *cuts], [*cuts, len(words)], strict=True)]
        return [line for piece in pieces for line in _wrap(piece, indent, width)]
    group = _long_group(words, top)
    if group:
        opened, closed = group
        return [
            *_wrap(words[: opened + 1], indent, width),
            *_wrap(words[opened + 1 : closed], indent + "    ", width),
            *_wrap(words[closed:], indent, width),
        ]
    return _fill(words, indent, width, top)


def _clause_cuts(words: Sequence[Word], top: int) -> list[int]:
    """Where a clause starts at the line's own depth (not at its first word)."""
    cuts, i = [], 1
    while i < len(words):
        upper = tuple(word.upper() for word, _, _ in words[i : i + 4])
        clause = next((c for c in CLAUSES if upper[: len(c)] == c), None)
        if clause and words[i][1] == top:
            cuts.append(i)
        i += len(clause) if clause else 1
    return cuts


def _long_group(words: Sequence[Word], top: int) -> tuple[int, int] | None:
    """A parenthesized group written across words (`AS (` ... `)`): where it opens and where
    the word that closes it stands."""
    for opened, (word, depth, _) in enumerate(words):
        if depth == top and word.endswith("("):
            for closed in range(opened + 1, len(words)):
                text, start, end = words[closed]
                if start > top and end <= top and text.startswith(")"):
                    return (opened, closed) if closed > opened + 1 else None
            return None
    return None


def _fill(words: Sequence[Word], indent: str, width: int, top: int) -> list[str]:
    """Words in lines of `width`, continued four spaces in, each cut where _cut says."""
    lines: list[str] = []
    current: list[Word] = []
    prefix = indent
    for word in words:
        current.append(word)
        while len(current) > 1 and len(_line(current, prefix)) > width:
            cut = _cut(current, prefix, width, top)
            lines.append(_line(current[:cut], prefix))
            current = current[cut:]
            prefix = indent + "    "
    lines.append(_line(current, prefix))
    return lines


def _cut(words: Sequence[Word], prefix: str, width: int, top: int) -> int:
    """Where to end a line of `words` (the index of the first word of the next): the last
    cut that fits, of the best kind that leaves the line at least a third full: after a
    top-level comma, or before a top-level AND, OR, WHEN or ELSE; then after any comma;
    then between any words."""

    def kind(i: int) -> int:
        word, depth, _ = words[i]
        before, _, before_depth = words[i - 1]
        if (before.endswith(",") and before_depth == top) or (
            depth == top and word.upper() in ("AND", "OR", "WHEN", "ELSE")
        ):
            return 2
        return 1 if before.endswith(",") else 0

    fitting = [i for i in range(1, len(words)) if len(_line(words[:i], prefix)) <= width]
    if not fitting:
        return 1

    def short(i: int) -> bool:
        return len(_line(words[:i], prefix)) < width // 3

    return max(fitting, key=lambda i: (kind(i) - 3 * short(i), i))
