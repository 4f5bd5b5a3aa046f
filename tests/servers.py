"""Real servers for tests: an app under uvicorn in a thread, or `mailbag` as a subprocess."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import uvicorn

from api_helpers import TEST_SECRET_KEY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_up(
    url: str, timeout: float = 30.0, process: subprocess.Popen[Any] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up")


@contextlib.contextmanager
def uvicorn_thread(app: Any) -> Iterator[str]:
    """The app served over real HTTP from a background thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{base}/healthz")
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def mailbag_env(database_url: str, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILBAG_")}
    env["MAILBAG_DATABASE_URL"] = database_url
    env.setdefault("MAILBAG_LOG_LEVEL", "WARNING")
    # API and worker processes on a database server refuse to start without the key.
    env.setdefault("MAILBAG_SECRET_KEY", TEST_SECRET_KEY)
    env.update({f"MAILBAG_{k.upper()}": v for k, v in settings.items()})
    return env


def start_mailbag(*args: str, env: Mapping[str, str], **popen: Any) -> subprocess.Popen[Any]:
    """`python -m mailbag ARGS` in its own process group (so signals reach only it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "mailbag", *args], env=dict(env), start_new_session=True, **popen
    )


def stop(process: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
    if process.poll() is None:
        os.killpg(process.pid, sig)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()
