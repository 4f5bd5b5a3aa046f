"""`mailbag send-bulk`: one templated message per row of a CSV file (issue 12).

Every row is checked before anything is written (new_message, the template rendered
with the row, the sender identity), so a bad row is reported with its line number and
never written. The good rows are then written in chunks, one transaction each, each row
under an idempotency key: a run that stops half-way (a crash, Ctrl-C, a lost database)
is finished by running the same command again, which skips what is already there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mailbag.cli.invocation import database, fail, settings, tenant_id

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rich.progress import Progress, TaskID
    from sqlalchemy import Engine

    from mailbag.domain.message import NewMessage
    from mailbag.services.intake import Rules
    from mailbag.services.outbox import Enqueued
    from mailbag.settings import Settings
    from mailbag.templates.book import Book

# Columns that address the message; every other column is template data.
ADDRESS_COLUMNS = ("to", "to_name", "cc", "bcc", "reply_to", "from", "from_name")
ACTOR = "cli:send-bulk"
SHOWN_BAD_ROWS = 50
# A good row: its line, its message, its fields; a bad one: its line, why, its fields.
Row = tuple[int, "NewMessage", list[str]]
Bad = tuple[int, str, list[str]]
# A row's idempotency key, from its fields by column and its line.
Key = Callable[[dict[str, str], int], str]
# Exits beyond invocation's 1 and 2: the good rows were written, some rows were bad.
PARTLY_WRITTEN = 3


# The options of `send-bulk`, each with its help, named once so its signature stays short.
FILE = Annotated[
    Path,
    typer.Argument(
        metavar="FILE",
        help="CSV file, UTF-8; the first line names the columns.",
        exists=True,
        dir_okay=False,
        readable=True,
    ),
]
TEMPLATE = Annotated[str, typer.Option(metavar="NAME", help="Template every row is sent with.")]
OWNER = Annotated[
    str,
    typer.Option(metavar="TENANT", help="Tenant the messages belong to: its id or its name."),
]
KEY_COLUMN = Annotated[
    str | None,
    typer.Option(
        metavar="COLUMN",
        help="Column whose value is each row's idempotency key (unique in the file and "
        "among the tenant's messages). Default: a key made of the file's content, the "
        "template and the row's line.",
    ),
]
KEY_PREFIX = Annotated[
    str,
    typer.Option(metavar="PREFIX", help="Put before every --key-column value, e.g. 'nov-digest:'."),
]
ALL_OR_NOTHING = Annotated[
    bool,
    typer.Option(help="Write nothing when any row is bad (default: write the good rows)."),
]
DRY_RUN = Annotated[bool, typer.Option(help="Check every row, write nothing.")]
REJECTS = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        help="Write the bad rows (with the header) to this CSV file, to fix and send it.",
    ),
]
PRIORITY = Annotated[
    str, typer.Option(metavar="PRIORITY", help="high, normal or low: higher is claimed first.")
]
CHUNK_SIZE = Annotated[
    int, typer.Option(metavar="N", min=1, max=10_000, help="Rows per transaction.")
]
DELIMITER = Annotated[str, typer.Option(metavar="CHAR", help="The CSV field separator.")]


def send_bulk(
    file: FILE,
    template: TEMPLATE,
    tenant: OWNER = "default",
    key_column: KEY_COLUMN = None,
    key_prefix: KEY_PREFIX = "",
    all_or_nothing: ALL_OR_NOTHING = False,
    dry_run: DRY_RUN = False,
    rejects: REJECTS = None,
    priority: PRIORITY = "normal",
    chunk_size: CHUNK_SIZE = 1000,
    delimiter: DELIMITER = ",",
) -> None:
    """Send one templated message per CSV row: the columns are the template's data.

    Column `to` is required: one address, or several separated by commas. Optional
    columns `to_name`, `cc`, `bcc`, `reply_to`, `from` (a sender identity of the tenant)
    and `from_name` address the message and are not template data; every other column
    is (as text). Every row is checked first; a bad row is reported with its line number
    and never written. The good rows are written 1,000 per transaction; exit 0 when every
    row was good, 2 when nothing was written (bad file, or bad rows with
    --all-or-nothing), 3 when the good rows were written and some rows were bad.

    Safe to re-run: each row has an idempotency key, so running the same command on the
    same file again (after a crash or Ctrl-C) writes only the rows not yet written. The
    default key is made of the file's content, the template and the row's line number: an
    edited file is a new send, every row of it. To fix bad rows, send the --rejects file
    after fixing it, not the edited original; or give rows stable keys with --key-column.
    """
    import time

    check_options(delimiter, priority, key_prefix, key_column)
    config = settings()
    rules = rules_with(config)
    engine = database()  # the schema checked before any row is
    owner = tenant_id(engine, tenant)  # an unknown tenant: exit 2 before any row is read
    known_template(engine, rules, owner, template)
    raw = read(file)
    started = time.perf_counter()
    sheet = parse_sheet(file, raw, template, delimiter, key_column)
    checker = RowChecker(
        columns=sheet.columns,
        template=template,
        tenant=owner,
        priority=priority,
        rules=rules,
        key=row_key(sheet.digest, key_column, key_prefix),
        key_column=key_column,
    )
    rows_given = len(sheet.body)
    with progress_bar() as progress:
        good, bad = check_rows(checker, sheet.body, progress)
        good, refused = check_in_database(engine, good, config.ready_from, rules.book)
        bad = sorted(bad + refused)
        report_bad(bad)
        if rejects is not None and bad:
            write_rejects(rejects, sheet.header, [record for _, _, record in bad], delimiter)
        if dry_run or (bad and all_or_nothing) or not good:
            why = "--dry-run" if dry_run else "--all-or-nothing" if good else "no good rows"
            typer.echo(
                f"{file}: {rows_given} rows: {len(good)} good, {len(bad)} bad; "
                f"nothing written ({why})"
            )
            raise typer.Exit(2 if bad else 0)
        writing = progress.add_task("writing", total=len(good))
        counts = write(engine, good, chunk_size, progress, writing, rules, config.ready_from)
    seconds = time.perf_counter() - started
    suppressed = f" ({counts['suppressed']} suppressed: not sent)" if counts["suppressed"] else ""
    typer.echo(
        f"{file}: {rows_given} rows: {counts['created']} created{suppressed}, "
        f"{counts['existing']} already there, {len(bad)} bad (not written); "
        f"{seconds:.1f} s, {rows_given / seconds:.0f} rows/s"
    )
    if bad:
        raise typer.Exit(PARTLY_WRITTEN)


def check_options(delimiter: str, priority: str, key_prefix: str, key_column: str | None) -> None:
    if len(delimiter) != 1:
        fail("--delimiter must be one character")
    if priority not in ("high", "normal", "low"):
        fail(f"--priority must be high, normal or low, not {priority!r}")
    if key_prefix and key_column is None:
        fail("--key-prefix goes with --key-column")


def rules_with(config: Settings) -> Rules:
    """The rules every row is checked under (services.intake)."""
    from mailbag import templates
    from mailbag.services import intake

    try:
        return intake.Rules.of(config)
    except templates.TemplateError as exc:
        fail(str(exc))


def known_template(engine: Engine, rules: Rules, tenant: str, template: str) -> None:
    """Exit 2 unless `template` is the tenant's (in the database) or a file template."""
    from mailbag.services.templates import is_template

    with engine.connect() as conn:
        if is_template(conn, tenant, template, rules.book):
            return
    names = ", ".join(sorted(rules.catalog.names()))
    fail(f"unknown template {template!r}: not one of tenant {tenant}'s, nor a file's ({names})")


@dataclass(frozen=True)
class Sheet:
    """A CSV file read: its header, the column names, the records after it, and the
    identity of the file and template for the default keys."""

    digest: str
    header: list[str]
    columns: list[str]
    body: list[tuple[int, list[str]]]


def parse_sheet(
    file: Path, raw: bytes, template: str, delimiter: str, key_column: str | None
) -> Sheet:
    import hashlib

    # The file's identity for the default keys: its content (not its name or place), and
    # the template, so the same list sent with another template is another send.
    digest = hashlib.sha256(template.encode() + b"\n" + raw).hexdigest()[:32]
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        fail(f"{file}: line {line} is not UTF-8 (byte {exc.start}); save the file as UTF-8")
    records = list(rows(file, text, delimiter))
    if not records:
        fail(f"{file} is empty: its first line must name the columns, one of them `to`")
    (_, header), body = records[0], records[1:]
    columns = [name.strip() for name in header]
    check_header(file, columns, key_column)
    if not body:
        fail(f"{file} has a header and no rows")
    return Sheet(digest, header, columns, body)


def row_key(digest: str, key_column: str | None, key_prefix: str) -> Key:
    """Each row's idempotency key: its --key-column value, else the file's and its line's."""
    if key_column:
        return lambda row, line: key_prefix + row[key_column].strip()
    return lambda row, line: f"bulk-{digest}-{line}"


def check_rows(
    checker: RowChecker, body: list[tuple[int, list[str]]], progress: Progress
) -> tuple[list[Row], list[Bad]]:
    """Every row checked, none written: the good ones with their messages, the bad with why."""
    good: list[Row] = []
    bad: list[Bad] = []
    checking = progress.add_task("checking", total=len(body))
    try:
        for n, (line, record) in enumerate(body, 1):
            problem, message = checker.check(line, record)
            if message is not None:
                good.append((line, message, record))
            else:
                bad.append((line, problem or "", record))
            if n % 1000 == 0:
                progress.update(checking, completed=n)
    except KeyboardInterrupt:
        progress.stop()
        fail("interrupted while checking the rows; nothing was written", code=1)
    progress.update(checking, completed=len(body))
    return good, bad


def read(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as exc:
        fail(f"{file}: {exc.strerror or exc}")


def rows(file: Path, text: str, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """(line where the record starts, its fields), blank lines left out; a record may span
    lines (a quoted line break)."""
    import csv
    import io

    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    start = 1
    try:
        for record in reader:
            if record:
                yield start, record
            start = reader.line_num + 1
    except csv.Error as exc:
        fail(f"{file}: line {reader.line_num}: not CSV: {exc}")


def check_header(file: Path, columns: list[str], key_column: str | None) -> None:
    if "to" not in columns:
        fail(f"{file}: the first line must name a `to` column; it names {', '.join(columns)}")
    if "" in columns:
        fail(f"{file}: column {columns.index('') + 1} of the first line has no name")
    seen: set[str] = set()
    for name in columns:
        if name in seen:
            fail(f"{file}: column {name!r} is named twice")
        seen.add(name)
    if key_column is not None and key_column not in columns:
        fail(f"--key-column {key_column!r} is not a column of {file}")


class RowChecker:
    """One row into a NewMessage, or what is wrong with it."""

    def __init__(
        self,
        *,
        columns: list[str],
        template: str,
        tenant: str,
        priority: str,
        rules: Rules,
        key: Key,
        key_column: str | None,
    ) -> None:
        self.columns, self.template, self.tenant = columns, template, tenant
        self.priority, self.rules, self.key, self.key_column = priority, rules, key, key_column
        self.keys: dict[str, int] = {}  # key -> the line that has it

    def check(self, line: int, record: list[str]) -> tuple[str | None, NewMessage | None]:
        from mailbag.domain.message import InvalidMessage

        if len(record) != len(self.columns):
            return f"has {len(record)} fields; the header has {len(self.columns)}", None
        row = dict(zip(self.columns, record, strict=True))
        if self.key_column is not None and not row[self.key_column].strip():
            return f"key column {self.key_column!r} is empty", None
        key = self.key(row, line)
        if (first := self.keys.get(key)) is not None:
            return f"key {key!r} is also line {first}'s", None
        to = addresses(row["to"])
        try:
            message = self.rules.message(
                to=to[0] if len(to) == 1 else to,
                to_name=row.get("to_name") or None,
                cc=addresses(row.get("cc", "")),
                bcc=addresses(row.get("bcc", "")),
                reply_to=addresses(row.get("reply_to", "")),
                from_address=row.get("from") or None,
                from_name=row.get("from_name") or None,
                template=self.template,
                data={k: v for k, v in row.items() if k not in ADDRESS_COLUMNS},
                tenant_id=self.tenant,
                idempotency_key=key,
                priority=self.priority,
                bulk=True,
            )
        except InvalidMessage as exc:
            return str(exc), None
        self.keys[key] = line
        return None, message


def addresses(cell: str) -> list[str]:
    return [a.strip() for a in cell.split(",") if a.strip()]


def check_in_database(
    engine: Engine, good: list[Row], ready_from: str | None, book: Book
) -> tuple[list[Row], list[Bad]]:
    """The rows that render with the template version they get (the tenant's in the
    database, else the file's: services.templates.pin_each), whose `from` is a sender
    identity of the tenant (on a ready sender domain, with `ready_from`:
    Settings.ready_from); and the others with why."""
    from mailbag.services.batch import refused_senders
    from mailbag.services.templates import pin_rows

    with engine.connect() as conn:
        messages, refused = pin_rows(conn, [m for _, m, _ in good], book)
        good = [(line, m, record) for (line, _, record), m in zip(good, messages, strict=True)]
        if ready_from or any(m.from_address for m in messages):
            refused = refused_senders(conn, messages, ready_from) | refused
    kept = [row for i, row in enumerate(good) if i not in refused]
    bad = [(good[i][0], str(exc), good[i][2]) for i, exc in sorted(refused.items())]
    return kept, bad


def report_bad(bad: list[Bad]) -> None:
    for line, problem, _ in bad[:SHOWN_BAD_ROWS]:
        typer.echo(f"line {line}: {problem}", err=True)
    if len(bad) > SHOWN_BAD_ROWS:
        typer.echo(
            f"... and {len(bad) - SHOWN_BAD_ROWS} more bad rows (--rejects FILE lists them all)",
            err=True,
        )


def write_rejects(path: Path, header: list[str], records: list[list[str]], delimiter: str) -> None:
    import csv

    try:
        with path.open("w", encoding="utf-8", newline="") as out:
            writer = csv.writer(out, delimiter=delimiter)
            writer.writerow(header)
            writer.writerows(records)
    except OSError as exc:
        fail(f"--rejects {path}: {exc.strerror or exc}")


def write(
    engine: Engine,
    good: list[Row],
    chunk_size: int,
    progress: Progress,
    task: TaskID,
    rules: Rules,
    ready_from: str | None,
) -> dict[str, int]:
    """Write the messages, `chunk_size` per transaction, WRITERS transactions at a time; a
    stop half-way says how to go on (every chunk is committed whole or not at all)."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from sqlalchemy.exc import SQLAlchemyError

    from mailbag.domain.message import InvalidMessage

    counts = {"created": 0, "existing": 0, "suppressed": 0}
    done = 0
    writers = 1 if engine.dialect.name == "sqlite" else WRITERS  # SQLite: one writer at a time
    in_flight: list[Future[list[Enqueued]]] = []

    def finish_oldest() -> None:
        nonlocal done
        results = in_flight[0].result()  # taken off only once answered: Ctrl-C here leaves
        in_flight.pop(0)  # it in flight, to be waited for and counted below
        tally(results, counts)
        done += len(results)
        progress.update(task, completed=done)

    with ThreadPoolExecutor(max_workers=writers, thread_name_prefix="send-bulk") as pool:
        try:
            for start in range(0, len(good), chunk_size):
                chunk = [message for _, message, _ in good[start : start + chunk_size]]
                in_flight.append(pool.submit(write_chunk, engine, chunk, rules, ready_from))
                if len(in_flight) >= writers:
                    finish_oldest()
            while in_flight:
                finish_oldest()
        except (SQLAlchemyError, InvalidMessage, KeyboardInterrupt) as exc:
            progress.stop()
            for pending in in_flight:  # those not started yet never will be
                pending.cancel()
            for pending in in_flight:  # and those running are committed or not: counted
                if not pending.cancelled() and pending.exception() is None:
                    done += len(pending.result())
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"failed: {exc}"
            fail(
                f"{why} after {done} of {len(good)} rows were written; run the same command "
                "again to write the rest (rows already written are skipped)",
                code=1,
            )
    return counts


# Chunks in flight at once, each in its own transaction on its own connection: the server
# writes one while the next is built and sent.
WRITERS = 2


def write_chunk(
    engine: Engine, chunk: list[NewMessage], rules: Rules, ready_from: str | None
) -> list[Enqueued]:
    from mailbag.services.outbox import write_many

    with engine.begin() as conn:
        return write_many(
            conn,
            chunk,
            book=rules.book,
            max_attempts=rules.max_attempts,
            actor=ACTOR,
            ready_from=ready_from,
        )


def tally(results: list[Enqueued], counts: dict[str, int]) -> None:
    from mailbag.domain.states import Status

    for result in results:
        if not result.created:
            counts["existing"] += 1
        else:
            counts["created"] += 1
            counts["suppressed"] += result.message.status == Status.FAILED


def progress_bar() -> Progress:
    """A progress bar on stderr when it is a terminal; nothing otherwise."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    return Progress(
        TextColumn("{task.description:>8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
    )
