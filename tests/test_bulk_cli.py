"""`mailbag send-bulk` on each database: rows become messages, bad rows are reported by line
and never written, and running the same file again writes nothing twice."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from mailbag.cli import app
from mailbag.services import outbox
from mailbag.services.tenants import add_sender, create_tenant
from mailbag.store.schema import outbox_messages as om

from conftest import TestDB
from helpers import count_rows

runner = CliRunner()


@pytest.fixture
def cli(db, monkeypatch):
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)

    def invoke(*args: str) -> Any:
        return runner.invoke(app, ["send-bulk", *args])

    return invoke


def csv_file(tmp_path: Path, text: str, name: str = "people.csv") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def messages(db: TestDB) -> list[Any]:
    with db.engine.connect() as conn:
        return list(conn.execute(select(om).order_by(om.c.to_address)).all())


def test_every_row_becomes_a_message_with_the_other_columns_as_data(cli, db, tmp_path):
    path = csv_file(
        tmp_path,
        "to,name,plan,cc,to_name\n"
        "ada@example.com,Ada,pro,,Ada Lovelace\n"
        "bob@example.com,Bob,free,boss@example.com,\n"
        "cy@example.com,Cy,pro,,\n",
    )
    done = cli(path, "--template", "welcome")
    assert done.exit_code == 0, done.output
    assert "3 rows: 3 created, 0 already there, 0 bad" in done.stdout
    rows = messages(db)
    assert [r.to_address for r in rows] == ["ada@example.com", "bob@example.com", "cy@example.com"]
    assert rows[0].template_data == {"name": "Ada", "plan": "pro"}
    assert rows[0].to_name == "Ada Lovelace"
    assert [a["address"] for a in rows[1].carried["recipients"]["cc"]] == ["boss@example.com"]
    assert all(r.template_name == "welcome" and r.tenant_id == "default" for r in rows)
    assert all(r.bulk for r in rows)  # bulk mail: claimed after transactional mail
    assert count_rows(db) == (3, 3)


def test_bad_rows_are_reported_by_line_and_only_the_good_ones_are_written(cli, db, tmp_path):
    add_sender(db.engine, "default", "news@acme.example")
    path = csv_file(
        tmp_path,
        "to,name,from,note\n"
        "ada@example.com,Ada,,\n"  # line 2
        "not-an-address,Bob,,\n"  # line 3
        'cy@example.com,Cy,,"a note\non two lines"\n'  # lines 4-5: a quoted line break
        "dee@example.com\n"  # line 6: fields missing
        "eve@example.com,Eve,someone@else.example,\n"  # line 7: not the tenant's sender
        'fay@example.com,"Fay\nF",,\n'  # lines 8-9: a line break in the subject
        "gil@example.com,Gil,news@acme.example,\n",  # line 10
    )
    rejects = tmp_path / "rejects.csv"
    done = cli(path, "--template", "welcome", "--rejects", str(rejects))
    assert done.exit_code == 3, done.output
    assert "3 created, 0 already there, 4 bad (not written)" in done.stdout
    lines = done.stderr.splitlines()
    assert lines[0].startswith("line 3: to: is not a valid email address")
    assert lines[1] == "line 6: has 1 fields; the header has 4"
    assert lines[2].startswith("line 7: from: someone@else.example is not a sender identity")
    assert lines[3].startswith("line 8: template: does not render with this data")
    sent = {r.to_address for r in messages(db)}
    assert sent == {"ada@example.com", "cy@example.com", "gil@example.com"}
    assert rejects.read_bytes().decode() == (
        "to,name,from,note\r\n"
        "not-an-address,Bob,,\r\n"
        "dee@example.com\r\n"
        "eve@example.com,Eve,someone@else.example,\r\n"
        'fay@example.com,"Fay\nF",,\r\n'
    )


def test_all_or_nothing_writes_nothing_when_a_row_is_bad(cli, db, tmp_path):
    path = csv_file(tmp_path, "to,name\nada@example.com,Ada\nbad,Bob\n")
    done = cli(path, "--template", "welcome", "--all-or-nothing")
    assert done.exit_code == 2
    assert "line 3:" in done.stderr and "nothing written (--all-or-nothing)" in done.stdout
    assert count_rows(db) == (0, 0)


def test_a_row_the_template_cannot_render_is_bad(cli, db, tmp_path):
    path = csv_file(tmp_path, "to,first_name\nada@example.com,Ada\n")  # welcome needs `name`
    done = cli(path, "--template", "welcome")
    assert done.exit_code == 2
    assert "line 2: template: does not render" in done.stderr
    assert "nothing written (no good rows)" in done.stdout
    assert count_rows(db) == (0, 0)


def test_running_the_same_file_again_writes_nothing_twice(cli, db, tmp_path):
    path = csv_file(tmp_path, "to,name\n" + "".join(f"u{i}@example.com,U{i}\n" for i in range(5)))
    first = cli(path, "--template", "welcome", "--chunk-size", "2")
    again = cli(path, "--template", "welcome")
    assert first.exit_code == again.exit_code == 0, first.output + again.output
    assert "5 created, 0 already there" in first.stdout
    assert "0 created, 5 already there" in again.stdout
    assert count_rows(db) == (5, 5)
    # The same rows sent with another template are another send.
    path = csv_file(
        tmp_path,
        "to,name,inviter,team,accept_url\na@example.com,A,Bo,Ops,https://x.example/a\n",
        "invite.csv",
    )
    assert "1 created" in cli(path, "--template", "welcome").stdout
    assert "1 created" in cli(path, "--template", "invitation").stdout
    assert "0 created, 1 already there" in cli(path, "--template", "invitation").stdout
    assert count_rows(db)[0] == 7


def test_a_run_that_stops_half_way_is_finished_by_running_it_again(cli, db, tmp_path, monkeypatch):
    path = csv_file(tmp_path, "to,name\n" + "".join(f"u{i}@example.com,U{i}\n" for i in range(5)))
    real = outbox.write_many
    calls = 0

    def crashing(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt  # Ctrl-C while the second chunk is written
        return real(*args, **kwargs)

    monkeypatch.setattr(outbox, "write_many", crashing)
    stopped = cli(path, "--template", "welcome", "--chunk-size", "2")
    assert stopped.exit_code == 1
    # Two chunks are written at a time: the third may have been, and the count says so.
    written = re.search(
        r"interrupted after (\d) of 5 rows were written; run the same", stopped.stderr
    )
    assert written is not None, stopped.stderr
    assert int(written[1]) in (2, 4) and count_rows(db)[0] == int(written[1])
    monkeypatch.setattr(outbox, "write_many", real)
    finished = cli(path, "--template", "welcome", "--chunk-size", "2")
    assert finished.exit_code == 0, finished.output
    assert f"{5 - int(written[1])} created, {written[1]} already there" in finished.stdout
    assert count_rows(db) == (5, 5)


def test_ctrl_c_while_a_chunk_is_written_counts_it_once_it_commits(cli, db, tmp_path, monkeypatch):
    """Ctrl-C reaches the main thread while it waits for a writer: the chunk in flight is
    committed (or not) all the same, and the count says which."""
    import signal
    import time

    from mailbag.cli import bulk

    real = bulk.write_chunk

    def slow(*args: Any) -> Any:
        signal.setitimer(signal.ITIMER_REAL, 0.1)  # Ctrl-C while the main thread waits
        time.sleep(0.6)
        return real(*args)

    def ctrl_c(*_: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(bulk, "write_chunk", slow)
    previous = signal.signal(signal.SIGALRM, ctrl_c)
    try:
        path = csv_file(tmp_path, "to,name\nada@example.com,Ada\nbob@example.com,Bob\n")
        stopped = cli(path, "--template", "welcome")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert stopped.exit_code == 1
    assert "interrupted after 2 of 2 rows were written" in stopped.stderr, stopped.stderr
    assert count_rows(db)[0] == 2


def test_ctrl_c_while_the_rows_are_checked_writes_nothing(cli, db, tmp_path, monkeypatch):
    from mailbag.cli import bulk

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(bulk.RowChecker, "check", interrupted)
    done = cli(csv_file(tmp_path, "to,name\nada@example.com,Ada\n"), "--template", "welcome")
    assert done.exit_code == 1
    assert "interrupted while checking the rows; nothing was written" in done.stderr
    assert count_rows(db) == (0, 0)


def test_key_column_gives_each_row_its_key_across_edited_files(cli, db, tmp_path):
    first = csv_file(tmp_path, "user_id,to,name\n1,ada@example.com,Ada\n2,bob@example.com,Bob\n")
    done = cli(first, "--template", "welcome", "--key-column", "user_id", "--key-prefix", "nov:")
    assert done.exit_code == 0, done.output
    assert sorted(r.idempotency_key for r in messages(db)) == ["nov:1", "nov:2"]
    assert messages(db)[0].template_data == {"user_id": "1", "name": "Ada"}
    # An edited file: a new row, a repeated key, a row without one; old rows stay sent once.
    edited = csv_file(
        tmp_path,
        "user_id,to,name\n3,cy@example.com,Cy\n1,ada@example.com,Ada L.\n"
        "3,dee@example.com,Dee\n,eve@example.com,Eve\n",
        "edited.csv",
    )
    again = cli(edited, "--template", "welcome", "--key-column", "user_id", "--key-prefix", "nov:")
    assert again.exit_code == 3, again.output
    assert "1 created, 1 already there, 2 bad" in again.stdout
    assert "line 4: key 'nov:3' is also line 2's" in again.stderr
    assert "line 5: key column 'user_id' is empty" in again.stderr
    assert count_rows(db)[0] == 3


@pytest.mark.parametrize(
    ("content", "args", "complaint"),
    [
        ("name\nAda\n", [], "must name a `to` column"),
        ("to,name\nada@example.com,Ada\n", ["--template", "nope"], "unknown template 'nope'"),
        ("", [], "is empty"),
        ("\n\n", [], "is empty"),
        ("to,name\n", [], "has a header and no rows"),
        ("to,name,name\na@example.com,A,B\n", [], "named twice"),
        ("to,name\na@example.com,A\n", ["--key-column", "id"], "is not a column"),
        ("to,name\na@example.com,A\n", ["--key-prefix", "x"], "goes with --key-column"),
        ("to,name\na@example.com,A\n", ["--priority", "urgent"], "--priority"),
        ('to,name\n"a@example.com,A\n', [], "not CSV"),
    ],
    ids=[
        "no-to",
        "unknown-template",
        "empty",
        "blank",
        "header-only",
        "twice",
        "key-column",
        "prefix-alone",
        "priority",
        "unclosed-quote",
    ],
)
def test_a_bad_file_or_option_exits_2_and_writes_nothing(
    cli, db, tmp_path, content, args, complaint
):
    path = csv_file(tmp_path, content)
    done = cli(path, *(args if "--template" in args else ["--template", "welcome", *args]))
    assert done.exit_code == 2, done.output
    assert complaint in done.stderr
    assert count_rows(db) == (0, 0)


def test_a_file_that_is_not_utf8_is_refused_with_its_line(cli, db, tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("to,name\nada@example.com,Ada\nzoe@example.com,Zoë\n".encode("latin-1"))
    done = cli(str(path), "--template", "welcome")
    assert done.exit_code == 2
    assert "line 3 is not UTF-8" in done.stderr
    assert count_rows(db) == (0, 0)


def test_a_byte_order_mark_and_other_tenants_and_dry_runs(cli, db, tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffto,name\nada@example.com,Ada\n".encode())
    dry = cli(str(path), "--template", "welcome", "--dry-run")
    assert dry.exit_code == 0 and "1 good, 0 bad; nothing written (--dry-run)" in dry.stdout
    assert count_rows(db) == (0, 0)
    acme, _ = create_tenant(db.engine, "acme")
    done = cli(str(path), "--template", "welcome", "--tenant", "acme", "--priority", "low")
    assert done.exit_code == 0, done.output
    (row,) = messages(db)
    assert (row.tenant_id, row.priority, row.to_address) == (acme.id, -1, "ada@example.com")


def test_a_progress_bar_on_a_terminal_and_none_otherwise(cli, db, tmp_path, monkeypatch):
    path = csv_file(tmp_path, "to,name\n" + "".join(f"u{i}@example.com,U{i}\n" for i in range(3)))
    quiet = cli(path, "--template", "welcome")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich draws as on a terminal
    again = cli(path, "--template", "welcome")
    assert again.exit_code == 0
    assert "checking" in again.stderr and "writing" in again.stderr and "3/3" in again.stderr
    assert "0 created, 3 already there" in again.stdout  # the summary stays on stdout


def test_an_unmigrated_database_is_refused_before_any_row_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("MAILBAG_DATABASE_URL", f"sqlite:///{tmp_path / 'new.db'}")
    path = csv_file(tmp_path, "to,name\nada@example.com,Ada\n")
    done = runner.invoke(app, ["send-bulk", path, "--template", "welcome"])
    assert done.exit_code == 1
    assert "mailbag migrate" in done.stderr
