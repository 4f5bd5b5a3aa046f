"""The README's and docs' examples, run as written.

Every fenced block of README.md and docs/*.md is read here (`examples()`):

- each ```python block is compiled, and run as a script in a scratch project: a migrated
  SQLite `mailbag.db` in its folder, the file provider writing into `mail/`, `mailbag serve`
  listening on a free port that stands in for the examples' `127.0.0.1:8025`, and a
  tenant's API key in `$KEY`;
- each ```sh block's `mailbag` and `python3 -m mailbag` commands are parsed by the real
  command line (run with `--help` appended, so every subcommand and option must exist), and
  the block is run with bash in the same scratch project;
- the JSON each `curl` example sends must parse.

A block that cannot run there says so, with its reason, on the line before its fence:
`<!-- not run: needs AWS credentials -->`. It is still compiled (python) and its commands
still parsed (sh). `test_the_examples_that_are_not_run_are_these` lists them.

Two of the shell examples are also checked for what they do. The verification walk-through
reads the token out of the `.eml` the file provider wrote with one shell command. `grep
"confirmation code"` used to print the HTML part's line too, quoted-printable and broken in
the middle of the token; the command now picks the text part's line, which is short ASCII
that quoted-printable never wraps. Here the command, taken from docs/api.md, runs in a
folder where the real file provider wrote a real verification email, and the token it
prints confirms the address.

The bulk example keyed rows by `user_id` alone, so next month's file, with the same ids,
was skipped row by row as "already there"; it now gives each send its own `--key-prefix`,
and the same command with next month's prefix writes every row again."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from email import policy
from email.parser import BytesParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api_helpers import api_client, new_tenant
from mailbag.cli import app
from mailbag.providers.file import FileProvider
from servers import free_port, mailbag_env, start_mailbag, stop, wait_until_up
from verification_helpers import deliver, request

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"^\s*<!-- not run: (.*?) -->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


@dataclass(frozen=True)
class Example:
    """One fenced block: where it is, its language, its text (dedented), and why it is not
    run (None: it is)."""

    page: Path
    line: int
    language: str
    text: str
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def examples_of(page: Path) -> Iterator[Example]:
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marked = NOT_RUN.match(before)
        text = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        yield Example(page, i + 1, fence.group(2), text, marked.group(1) if marked else None)
        i = end + 1


def examples(language: str) -> list[Example]:
    return [e for page in PAGES for e in examples_of(page) if e.language == language]


def ids(found: list[Example]) -> list[str]:
    return [e.where for e in found]


def shell_blocks() -> list[str]:
    return [example.text for example in examples("sh")]


def readme_token_command() -> str:
    (command,) = [
        line
        for block in shell_blocks()
        for line in block.splitlines()
        if "confirmation code" in line and "mail/" in line
    ]
    return command


def readme_bulk_example() -> str:
    (block,) = [b for b in shell_blocks() if "send-bulk people.csv" in b and "--key-prefix" in b]
    return block


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
@pytest.mark.parametrize("email", ["reader@example.com", f"{'a-long-name.' * 5}x@example.com"])
async def test_the_readmes_command_prints_the_whole_token_of_a_real_eml(
    db, async_engine, tmp_path, email
):
    _, key = new_tenant(db)
    async with api_client(db, key) as api:
        older = await request(api, "earlier@example.com", key="earlier")
        assert older.status_code == 201, older.text
        await deliver(db, async_engine, FileProvider(tmp_path / "mail"))
        started = await request(api, email, key="signup")
        assert started.status_code == 201, started.text
        await deliver(db, async_engine, FileProvider(tmp_path / "mail"))

        shown = subprocess.run(
            ["bash", "-c", readme_token_command()],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        (line,) = shown.splitlines()  # one line: the newest email's
        token = line.removeprefix("Your confirmation code: ")

        # The same token an email client shows (the text part, decoded) ...
        newest = max((tmp_path / "mail").glob("*.eml"))
        parsed = BytesParser(policy=policy.default).parsebytes(newest.read_bytes())
        assert parsed["To"].addresses[0].addr_spec == email
        text = parsed.get_body(("plain",)).get_content()  # type: ignore[union-attr]
        assert f"Your confirmation code: {token}\n" in text
        # ... and the one the API takes.
        confirmed = await api.post(
            f"/v1/email-verifications/{started.json()['id']}/confirm", json={"token": token}
        )
    assert confirmed.status_code == 200, confirmed.text
    assert confirmed.json()["state"] == "verified"


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_the_readmes_bulk_example_sends_next_months_file_too(db, tmp_path):
    # `python3` as the README says, the one running these tests; the tests' database.
    env = {
        **mailbag_env(db.url),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }

    def run(script: str) -> str:
        done = subprocess.run(
            ["bash", "-ec", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stderr + done.stdout

    example = readme_bulk_example()
    prefix = re.search(r"--key-prefix (\S+)", example)
    assert prefix is not None, "the example gives each send its own key prefix"
    assert "2 created, 0 already there" in run(example)
    assert "0 created, 2 already there" in run(example)  # run again: nothing twice
    next_month = example.replace(prefix.group(1), "welcome-2024-12:")
    assert "2 created, 0 already there" in run(next_month)


# --- Every example of the README and docs/ ---------------------------------------------------


@dataclass(frozen=True)
class Project:
    """A scratch folder as the README leaves it: migrated, `mailbag serve` running in it."""

    folder: Path
    env: dict[str, str]
    port: int

    def script(self, example: Example) -> str:
        """The example's text, pointed at this project's server instead of port 8025."""
        return example.text.replace(":8025", f":{self.port}")

    def run(self, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command,
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    folder = tmp_path_factory.mktemp("examples")
    port = free_port()
    env = {  # the embedded default, `python3` the interpreter running these tests
        **mailbag_env("sqlite:///mailbag.db", api_port=str(port)),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    scratch = Project(folder, env, port)
    migrated = scratch.run(sys.executable, "-m", "mailbag", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    created = scratch.run(sys.executable, "-m", "mailbag", "tenants", "create", "examples")
    assert created.returncode == 0, created.stderr
    env["KEY"] = created.stdout.strip()
    with (folder / "serve.log").open("w") as log:
        server = start_mailbag("serve", env=env, cwd=folder, stdout=log, stderr=log)
        try:
            wait_until_up(f"http://127.0.0.1:{port}/healthz", process=server)
            # One email through the worker first, so `mail/` holds one as the README's
            # `ls mail/` expects by the time a person types it.
            sent = scratch.run(
                *(sys.executable, "-m", "mailbag", "enqueue", "--to", "setup@example.com"),
                *("--subject", "Set-up", "--text", "The project sends."),
            )
            assert sent.returncode == 0, sent.stderr
            deadline = time.monotonic() + 30
            while not list((folder / "mail").glob("*.eml")):
                assert time.monotonic() < deadline, (folder / "serve.log").read_text()
                time.sleep(0.1)
            yield scratch
        finally:
            stop(server)


PYTHON = examples("python")
SHELL = examples("sh")
RUN_PYTHON = [e for e in PYTHON if e.not_run is None]
RUN_SHELL = [e for e in SHELL if e.not_run is None]


@pytest.mark.parametrize("example", PYTHON, ids=ids(PYTHON))
def test_every_python_example_compiles(example: Example) -> None:
    ast.parse(example.text, filename=example.where)


@pytest.mark.parametrize("example", RUN_PYTHON, ids=ids(RUN_PYTHON))
def test_every_python_example_runs(project: Project, example: Example) -> None:
    done = project.run(sys.executable, "-c", project.script(example))
    assert done.returncode == 0, f"{example.where}:\n{done.stdout}{done.stderr}"


# Where a command ends in a shell line (shlex's punctuation tokens).
COMMAND_ENDS = {";", "&&", "||", "|", "&", "(", ")", "<", ">", ">>", "<<", ";;"}


def command_lines(script: str) -> Iterator[str]:
    """The script's lines with continuations joined (a quote left open continues the line
    too) and here-documents' bodies left out."""
    lines = iter(script.replace("\\\n", " ").splitlines())
    for first in lines:
        line = first
        while not balanced(line):
            line += "\n" + next(lines)
        yield line
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", line)
        if heredoc:
            for body in lines:
                if body.strip() == heredoc.group(1):
                    break


def balanced(line: str) -> bool:
    try:
        shlex.split(line, comments=True)
    except ValueError:  # No closing quotation
        return False
    return True


def mailbag_commands(script: str) -> list[list[str]]:
    """The arguments of each `mailbag ...` or `python3 -m mailbag ...` in a shell script."""
    found = []
    for line in command_lines(script):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        for i, token in enumerate(tokens):
            via_python = i >= 2 and tokens[i - 1] == "-m" and tokens[i - 2].startswith("python")
            at_start = i == 0 or tokens[i - 1] in COMMAND_ENDS
            if token == "mailbag" and (via_python or at_start):
                rest = tokens[i + 1 :]
                end = next((j for j, t in enumerate(rest) if t in COMMAND_ENDS), len(rest))
                found.append(rest[:end])
    return found


COMMANDS = [(e.where, args) for e in SHELL for args in mailbag_commands(e.text)]


def test_the_shell_examples_hold_mailbag_commands_to_check() -> None:
    # Guards the parametrized test below against finding nothing.
    assert len(COMMANDS) >= 15
    assert (
        "README.md:43",
        ["enqueue", "--to", "you@example.com", "--template", "welcome", "--data", '{"name":"Ada"}'],
    ) in [(where, args) for where, args in COMMANDS if where.startswith("README")]
    assert mailbag_commands(
        "K=$(mailbag hooks add a https://x/mailbag --event sent) # mailbag x"
    ) == [["hooks", "add", "a", "https://x/mailbag", "--event", "sent"]]


@pytest.mark.parametrize(
    ("where", "args"), COMMANDS, ids=[f"{w} {shlex.join(a)}" for w, a in COMMANDS]
)
def test_every_mailbag_command_in_a_shell_example_is_one_the_cli_takes(
    where: str, args: list[str]
) -> None:
    # --help stops before any option's value is used, but only once every subcommand and
    # option before it was found: a renamed command or option fails here.
    done = CliRunner().invoke(app, [*args, "--help"], prog_name="mailbag")
    assert done.exit_code == 0, f"{where}: mailbag {shlex.join(args)}\n{done.output}"
    assert done.output.startswith("Usage: mailbag")


# curl exits 0 on any HTTP answer: here an error answer (4xx, 5xx) fails the example.
FAILING_CURL = 'curl() { command curl --fail-with-body "$@"; }\n'


@pytest.mark.parametrize("example", RUN_SHELL, ids=ids(RUN_SHELL))
def test_every_shell_example_runs(project: Project, example: Example) -> None:
    script = FAILING_CURL + project.script(example)
    done = project.run("bash", "-e", "-o", "pipefail", "-c", script)
    assert done.returncode == 0, f"{example.where}:\n{done.stdout}{done.stderr}"


def curl_bodies(script: str) -> list[str]:
    """What each curl sends: `-d '...'` and here-documents (`-d @- <<JSON`)."""
    quoted = re.findall(r"(?:-d|--data) '([^']*)'", script)
    heredocs = re.findall(r"<<-?\s*'?(\w+)'?\n(.*?)\n\1\n", script, re.S)
    return [*quoted, *(body for _, body in heredocs)]


BODIES = [(e.where, body) for e in SHELL if "curl" in e.text for body in curl_bodies(e.text)]


@pytest.mark.parametrize(("where", "body"), BODIES, ids=[where for where, _ in BODIES])
def test_the_json_a_curl_example_sends_parses(where: str, body: str) -> None:
    assert isinstance(json.loads(body), dict), where


def test_the_curl_examples_hold_json_to_check() -> None:
    assert len(BODIES) >= 6
    assert {where.split(":")[0] for where, _ in BODIES} >= {"README.md", "docs/api.md"}


def test_the_examples_that_are_not_run_are_these() -> None:
    # Each says why on the line before its fence; every other block runs above. A new block
    # that cannot run is counted here on purpose.
    not_run = [e for e in [*PYTHON, *SHELL] if e.not_run is not None]
    assert all(e.not_run and e.not_run.strip() for e in not_run)
    assert Counter(str(e.page.relative_to(ROOT)) for e in not_run) == {
        "README.md": 4,  # serve; the test suite; two fragments of a Django project
        "docs/api.md": 1,  # placeholders (its token command runs above, on a real email)
        "docs/benchmarks.md": 15,  # benchmarks: minutes of load each
        "docs/client.md": 1,  # continues the client example, which runs
        "docs/deliverability.md": 1,  # a key rotation: each step waits for DNS
        "docs/development.md": 1,  # the test suite itself
        "docs/django.md": 4,  # pip install; manage.py; models of a Django project
        "docs/hooks.md": 3,  # a receiver serving until stopped; ids of yours as placeholders
        "docs/messages.md": 4,  # your application's engine; the files they attach
        "docs/scaling.md": 1,  # fills 10^7 rows: about an hour
    }


def test_a_not_run_mark_stands_before_a_fence() -> None:
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if NOT_RUN.match(line):
                after = next(x for x in lines[i + 1 :] if x.strip())
                assert FENCE.match(after), f"{page.relative_to(ROOT)}:{i + 1}"


# --- Links between the README and docs/ ------------------------------------------------------


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    found: set[str] = set()
    inside = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif not inside and line.startswith("#"):
            slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            n, anchor = 0, slug
            while anchor in found:
                n += 1
                anchor = f"{slug}-{n}"
            found.add(anchor)
    return found


LINKED = [*PAGES, ROOT / "docs" / "sql" / "README.md", ROOT / "CHANGELOG.md"]


@pytest.mark.parametrize("page", LINKED, ids=[str(p.relative_to(ROOT)) for p in LINKED])
def test_every_link_between_the_docs_leads_somewhere(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (
            anchor and linked.suffix == ".md" and anchor not in anchors(linked)
        ):
            broken.append(target)
    assert broken == []
