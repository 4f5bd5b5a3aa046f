"""The first run: `mailbag serve` listens before it says so, and stops at once, saying why,
when a part cannot start; `mailbag --help` starts without the server's libraries.

`.ci/first-run` does the README's first command end to end in a fresh virtualenv.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mailbag.store import migrate
from mailbag.store.database import make_engine
from servers import free_port, mailbag_env, start_mailbag, stop, wait_until_up

START_TIMEOUT = 60  # a bound on a loaded machine, not a speed requirement
BANNER = "API on http://"
HEAVY = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "botocore", "pydantic")


def modules_loaded_by(code: str, **run: Any) -> set[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, **run
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def loaded_within(loaded: set[str], packages: tuple[str, ...]) -> set[str]:
    return {m for m in loaded if any(m == p or m.startswith(f"{p}.") for p in packages)}


def test_the_command_line_loads_no_server_library_to_start():
    # `mailbag --help` took 1.1 s of CPU importing FastAPI, SQLAlchemy and botocore.
    loaded = modules_loaded_by(
        "from mailbag.cli import app\n"
        "try:\n"
        "    app(['--help'], prog_name='mailbag')\n"
        "except SystemExit:\n"
        "    pass"
    )
    assert "mailbag.cli" in loaded and "typer" in loaded
    assert {m for m in loaded if m.partition(".")[0] in HEAVY} == set()


def modules_loaded_by_command(args: list[str], url: str, cwd: Path) -> set[str]:
    """What `mailbag ARGS` loads, run to a successful end on the database at `url`."""
    return modules_loaded_by(
        "from mailbag.cli import app\n"
        "try:\n"
        f"    app({args!r}, prog_name='mailbag')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code",
        env=mailbag_env(url),
        cwd=cwd,
    )


# Only the long-running commands need these; the ORM comes with SQLAlchemy's asyncio extension.
SERVER_ONLY = (
    *("fastapi", "starlette", "uvicorn", "botocore", "alembic", "structlog"),
    *("mailbag.api", "mailbag.worker", "mailbag.console"),
)
SYNC_ONLY_AVOIDS = ("sqlalchemy.orm", "sqlalchemy.ext.asyncio")
TABLES = ("rich",)  # only `stats` without --json draws one


@pytest.mark.parametrize(
    ("args", "avoided"),
    [
        (["stats", "--json"], SERVER_ONLY + TABLES),
        (
            ["enqueue", "--to", "a@example.com", "--template", "welcome", "--data", '{"name":"A"}'],
            SERVER_ONLY + SYNC_ONLY_AVOIDS + TABLES,
        ),
    ],
    ids=["stats", "enqueue"],
)
def test_operator_commands_load_only_what_they_use(tmp_path, args, avoided):
    # `mailbag stats` took 1.2 s of CPU: Alembic to compare one revision, structlog, the ORM.
    url = f"sqlite:///{tmp_path / 'mailbag.db'}"
    engine = make_engine(url, null_pool=True)
    migrate.upgrade(engine)
    engine.dispose()
    loaded = modules_loaded_by_command(args, url, tmp_path)
    assert "mailbag.services.outbox" in loaded or "mailbag.services.operations" in loaded
    assert loaded_within(loaded, avoided) == set()


def test_the_package_still_exports_enqueue_on_first_use():
    loaded = modules_loaded_by("import mailbag\nassert callable(mailbag.enqueue)")
    assert "mailbag.services.outbox" in loaded


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A working folder like a new user's: the SQLite default and ./mail land here."""
    return tmp_path


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port something else already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def serve_env(folder: Path, **settings: str) -> dict[str, str]:
    env = mailbag_env(f"sqlite:///{folder / 'mailbag.db'}", **settings)
    env.pop("MAILBAG_SECRET_KEY", None)  # the SQLite default needs none: a key file is made
    return env


def serve_until_it_exits(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_until_it_exits(folder, env, "serve")


def run_until_it_exits(
    folder: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mailbag", *args],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize("command", ["serve", "api"])
def test_a_taken_port_is_said_once_and_the_command_exits_1(folder, held_port, command):
    # serve used to print "API on http://..." and then fail; then it said the error twice
    # (uvicorn's log line, then its own). Now once, and it never claims to listen.
    if command == "api":  # it needs the schema `serve` makes
        assert run_until_it_exits(folder, serve_env(folder), "migrate").returncode == 0
    result = run_until_it_exits(folder, serve_env(folder), command, "--port", str(held_port))
    assert result.returncode == 1, result.stderr
    assert BANNER not in result.stderr
    assert f"the API could not start on 127.0.0.1:{held_port}: the port is taken" in result.stderr
    assert result.stderr.count("already in use") == 1, result.stderr
    assert "Errno" not in result.stderr


@pytest.mark.slow
def test_serve_exits_at_once_when_the_api_cannot_be_imported(folder):
    # A missing dependency (once: itsdangerous, undeclared) stopped only the API, silently.
    fake = folder / "fake"
    (fake / "fastapi").mkdir(parents=True)
    (fake / "fastapi" / "__init__.py").write_text("raise ImportError('fastapi is missing')\n")
    env = serve_env(folder, api_port=str(free_port()))
    env["PYTHONPATH"] = os.pathsep.join([str(fake), *filter(None, [env.get("PYTHONPATH")])])
    result = serve_until_it_exits(folder, env)
    assert result.returncode != 0
    assert BANNER not in result.stderr
    assert "the API could not start" in result.stderr
    assert "fastapi is missing" in result.stderr


@pytest.mark.slow
def test_serve_stops_the_api_and_exits_when_the_worker_cannot_start(folder, held_port):
    env = serve_env(folder, api_port=str(free_port()), metrics_port=str(held_port))
    result = serve_until_it_exits(folder, env)
    assert result.returncode != 0
    assert "the worker stopped" in result.stderr
    assert "Address already in use" in result.stderr


@pytest.mark.slow
def test_serve_listens_before_it_says_so_and_stops_cleanly_on_sigterm(folder):
    port = free_port()
    log = folder / "serve.log"
    with log.open("w") as stderr:
        server = start_mailbag(
            "serve", env=serve_env(folder, api_port=str(port)), cwd=folder, stderr=stderr
        )
        try:
            wait_until_up(f"http://127.0.0.1:{port}/healthz", START_TIMEOUT, server)
            assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
            assert BANNER in log.read_text()
        finally:
            code = stop(server, signal.SIGTERM)
    assert code == 0, log.read_text()
    assert (folder / "mailbag.db").exists() and (folder / "mailbag.db.key").exists()
    assert os.stat(folder / "mailbag.db.key").st_mode & 0o077 == 0


def first_lines(process: subprocess.Popen[str], n: int) -> list[str]:
    """The first n lines the command writes to stderr, each answered at once: a line that
    says a part listens must come only once it does."""
    assert process.stderr is not None
    lines = []
    while len(lines) < n:
        line = process.stderr.readline()
        assert line, f"the command ended after {lines}"
        if line.startswith("mailbag: ") and " on http://" in line:
            url = line.split(" on ", 1)[1].split()[0]
            probe = f"{url}/login" if url.endswith("/admin") else f"{url}/healthz"
            assert httpx.get(probe).status_code == 200, line
        lines.append(line.rstrip("\n"))
    return lines


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "console"),
    [("serve", True), ("serve", False), ("api", True), ("api", False)],
    ids=["serve-console", "serve", "api-console", "api"],
)
def test_serve_and_api_listen_on_port_and_say_so_once_for_each_part(folder, command, console):
    # `serve` had no --port and `api --port` printed nothing: now each part's line, once
    # it listens, on the port given on the command line (over MAILBAG_API_PORT).
    port = free_port()
    env = serve_env(folder, api_port=str(free_port()), provider="console")
    if console:
        env["MAILBAG_ADMIN_PASSWORD"] = "a console password"
    if command == "api":
        assert run_until_it_exits(folder, env, "migrate").returncode == 0
    process = subprocess.Popen(
        [sys.executable, "-m", "mailbag", command, "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        cwd=folder,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        expected = [
            f"mailbag: API on http://127.0.0.1:{port} (docs at http://127.0.0.1:{port}/docs)"
        ]
        if console:
            expected.append(f"mailbag: console on http://127.0.0.1:{port}/admin")
        assert first_lines(process, len(expected)) == expected
        assert httpx.get(f"http://127.0.0.1:{port}/admin/login").status_code == (
            200 if console else 404
        )
    finally:
        code = stop(process, signal.SIGTERM)
        rest = process.stderr.read() if process.stderr else ""
    assert code == 0, rest
    assert " on http://" not in rest  # each said once
