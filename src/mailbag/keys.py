"""The deployment's secret key: it signs console sessions and derives verification tokens;
and the one comparison every configured credential goes through (`secret_matches`).

The key never enters the database, so a dump, a read replica or a backup of the database
can neither confirm a pending address nor forge an operator's session. Each use gets its
own subkey (`derive`), so one purpose's output says nothing about another's.

Where the key comes from, in order:
- `SECRET_KEY` (at least 32 characters; the same on every API and worker replica);
- for the embedded SQLite default only, a random key generated once and kept in a file
  beside the database (`mailbag.db.key`, mode 0600), so `serve` needs no setting;
- otherwise nothing: the process refuses to start and says which setting to set.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

from mailbag.database_url import dialect_of

if TYPE_CHECKING:
    from pydantic import SecretStr

MIN_LENGTH = 32
GENERATE_HINT = "generate one with `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`"
KEY_FILE_SUFFIX = ".key"


class MissingSecretKey(RuntimeError):
    """No usable key: the message says what to set."""


def derive(key: bytes, purpose: str) -> bytes:
    """A subkey for one purpose (HMAC-SHA256 of the purpose under the deployment key)."""
    return hmac.new(key, f"mailbag/{purpose}".encode(), hashlib.sha256).digest()


def secret_matches(offered: str | None, expected: SecretStr | None) -> bool:
    """Whether a submitted credential is the configured one. An empty or missing one never
    is, nor is anything when no credential is configured. Digests of equal length are
    compared in constant time, so the time taken says nothing about the secret's length."""
    if not offered or expected is None or not expected.get_secret_value():
        return False
    return hmac.compare_digest(
        hashlib.sha256(offered.encode("utf-8", "surrogatepass")).digest(),
        hashlib.sha256(expected.get_secret_value().encode("utf-8", "surrogatepass")).digest(),
    )


def bearer_matches(authorization: str | None, expected: SecretStr | None) -> bool:
    """Whether an `Authorization` header is `Bearer <expected>` (e.g. METRICS_TOKEN)."""
    scheme, _, offered = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and secret_matches(offered, expected)


def load(secret_key: str | None, database_url: str) -> bytes:
    if secret_key is not None:
        if len(secret_key) < MIN_LENGTH:
            raise MissingSecretKey(
                f"MAILBAG_SECRET_KEY is shorter than {MIN_LENGTH} characters; {GENERATE_HINT}"
            )
        return secret_key.encode()
    path = _sqlite_file(database_url)
    if path is None:
        raise MissingSecretKey(
            "MAILBAG_SECRET_KEY is not set: with a database server, every API and worker "
            "replica needs the same key (it signs console sessions and derives verification "
            f"tokens); {GENERATE_HINT}"
        )
    return _key_file(path)


def _sqlite_file(database_url: str) -> Path | None:
    if dialect_of(database_url) != "sqlite":
        return None
    database = make_url(database_url).database
    if not database or database == ":memory:":
        return None
    return Path(database).with_name(Path(database).name + KEY_FILE_SUFFIX)


def _key_file(path: Path) -> bytes:
    """Read the key beside the database, creating it (0600) the first time.

    The new key is written to a private temporary file and linked into place, which fails
    if another process got there first: no process ever reads a half-written key.
    """
    if not path.exists():
        key = secrets.token_urlsafe(MIN_LENGTH).encode()
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(key + b"\n")
            os.link(temporary, path)
        except FileExistsError:
            pass  # another process made it: use theirs
        finally:
            temporary.unlink()
    key = path.read_bytes().strip()
    if len(key) < MIN_LENGTH:
        raise MissingSecretKey(
            f"{path} holds no usable key (empty or too short): remove it to generate a new "
            "one (sessions end and unconfirmed verification codes stop working), or set "
            "MAILBAG_SECRET_KEY"
        )
    return key
