"""The recorder's readable SQL (mailbag.sqlrecorder) and docs/sql's entries for statements
outside any plan (sqldocs.Statement), on statements built here: no database needed."""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData, String, Table, bindparam, literal, select, text
from sqlalchemy import update as sql_update

from mailbag import sqldocs, sqlrecorder
from mailbag.store.plan import Step

things = Table(
    "things",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("name", String(50)),
    Column("state", String(20)),
)


def test_a_literal_takes_the_name_of_the_column_it_sets_or_is_compared_with() -> None:
    statement = (
        sql_update(things)
        .where(things.c.state == literal("old"), things.c.id.in_([1, 2]))
        .values(name=literal("new"), state=literal("done"))
    )
    sql = sqlrecorder.readable(Step(statement), "postgresql")
    assert "name=:name" in sql and "state=:state" in sql
    assert "things.state = :state_2" in sql  # another value: another name
    assert "IN (:id_1, :id_2)" in sql  # a list expanded as the driver receives it
    assert ":param" not in sql and "::" not in sql  # no anonymous names, no psycopg casts


def test_limit_and_offset_are_named_so() -> None:
    query = select(things.c.id).order_by(things.c.id).limit(10).offset(20)
    for dialect in ("postgresql", "sqlite"):
        assert "LIMIT :limit OFFSET :offset" in sqlrecorder.readable(Step(query), dialect)
    assert "LIMIT :offset, :limit" in sqlrecorder.readable(Step(query), "mysql")


def test_an_explicit_name_is_kept() -> None:
    query = select(things.c.id).where(things.c.name == bindparam("wanted"))
    assert "things.name = :wanted" in sqlrecorder.readable(Step(query), "sqlite")


def sample_round_trip(tenant: str) -> None:
    """A statement handed to the driver as it is, outside any plan (a sample)."""


def test_a_statement_outside_any_plan_is_shown_under_its_functions_name() -> None:
    def steps() -> list[Step]:
        query = select(things.c.id).where(things.c.name == bindparam("tenant"))
        return [Step(text("BEGIN")), Step(query), Step(text("COMMIT"))]

    entry = sqldocs.Statement(sample_round_trip, steps)
    assert entry.name == "test_sql_recorder.sample_round_trip"
    assert (
        entry.description
        == "A statement handed to the driver as it is, outside any plan (a sample)."
    )
    lines = sqldocs._entry(entry, "postgresql")  # its part of postgresql.sql
    assert lines[0] == "-- name: test_sql_recorder.sample_round_trip --"
    assert lines.count("-- step 2 of 3") == 1 and "BEGIN;" in lines and "COMMIT;" in lines
    elsewhere = sqldocs._entry(entry, "sqlite")
    assert elsewhere[-1] == "-- No statement on SQLite: it runs none here."
