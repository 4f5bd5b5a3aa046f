"""Secrets at rest: the database never holds a verification token, nor a link carrying one.

The whole database is dumped (every table, every column, as text) after a request, its
email, a resend and the second email; the codes that went out must not be in it, and the
newest one must still confirm.
"""

from __future__ import annotations

import email
import email.policy
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, select

from api_helpers import api_client, new_tenant
from mailbag.api import create_app
from mailbag.domain.verification import EmailReference, Tokens, digest
from mailbag.keys import MissingSecretKey
from mailbag.providers.file import FileProvider
from mailbag.settings import Settings
from mailbag.worker import WorkerConfig
from verification_helpers import deliver, request, resend, token_in, tokens

from conftest import TestDB
from helpers import enqueue

REDIRECT = "https://app.example.com/verify?step=2"


def as_text(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def dump(db: TestDB) -> str:
    """Every row of every table the database has (found by reflection, not our schema)."""
    tables = MetaData()
    tables.reflect(db.engine)
    lines = []
    with db.engine.connect() as conn:
        for table in tables.sorted_tables:
            for row in conn.execute(select(table)):
                lines.append(f"{table.name}: " + " | ".join(as_text(v) for v in row))
    return "\n".join(lines)


def raw_files(db: TestDB) -> bytes:
    """For SQLite, the database's own bytes too (the file and its write-ahead log)."""
    if db.dialect != "sqlite":
        return b""
    path = Path(db.engine.url.database)
    return b"".join(
        p.read_bytes() for p in (path, path.with_name(path.name + "-wal")) if p.exists()
    )


def emailed(folder: Path) -> list[str]:
    """The text part of each .eml file the file provider wrote, oldest first."""
    texts = []
    for path in sorted(folder.glob("*.eml")):
        parsed = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
        texts.append(parsed.get_body(("plain",)).get_content())  # type: ignore[union-attr]
    return texts


async def test_no_token_or_link_is_ever_stored_and_the_emailed_one_confirms(
    db, async_engine, tmp_path
):
    _, key = new_tenant(db)
    outbox = tmp_path / "outbox"
    async with api_client(db, key) as api:
        created = await request(api, redirect_url=REDIRECT, data={"name": "Ada"})
        assert created.status_code == 201, created.text
        v = created.json()
        await deliver(db, async_engine, FileProvider(outbox))
        resent = await resend(api, v["id"], "resend-1")
        assert resent.status_code == 200, resent.text
        await deliver(db, async_engine, FileProvider(outbox))

        first, second = emailed(outbox)
        codes = [token_in(first), token_in(second)]
        assert codes[0] != codes[1]
        links = [line.split()[-1] for line in (first + second).splitlines() if "token=" in line]
        assert len(links) == 2 and all(REDIRECT in link for link in links)

        everything = dump(db)
        assert v["id"] in everything and "Ada" in everything  # the dump does see the data
        for secret in [*codes, *links]:
            assert secret not in everything
            assert secret.encode() not in raw_files(db)
        assert "token=" not in everything  # nor any other link carrying a token
        # What the database holds instead: the digest, and which send each email was.
        assert digest(codes[1]) in everything and digest(codes[0]) not in everything

        url = f"/v1/email-verifications/{v['id']}/confirm"
        assert (await api.post(url, json={"token": codes[0]})).status_code == 400  # rotated away
        confirmed = await api.post(url, json={"token": codes[1]})
        assert confirmed.status_code == 200 and confirmed.json()["state"] == "verified"
    # The codes are the ones the deployment key derives, and nothing else can make them.
    assert codes == [tokens(db).token(uuid.UUID(v["id"]), n) for n in (1, 2)]


async def test_without_the_key_neither_api_nor_worker_starts_on_a_database_server(db):
    settings = Settings.model_validate({"database_url": db.url, "log_level": "WARNING"})
    if db.dialect == "sqlite":  # the embedded default keeps its own key beside the file
        assert WorkerConfig.from_settings(settings).tokens == settings.verification_tokens
        return
    with pytest.raises(MissingSecretKey, match="MAILBAG_SECRET_KEY"):
        WorkerConfig.from_settings(settings)
    app = create_app(settings)
    with pytest.raises(MissingSecretKey, match="MAILBAG_SECRET_KEY"):
        async with app.router.lifespan_context(app):
            pass


async def test_an_email_queued_before_the_upgrade_still_goes_out_with_its_stored_token(
    db, async_engine
):
    """Emails written by an older mailbag carry their token in their data and no send
    number: they render as written (and expire with their verification)."""
    legacy = {"verification_id": str(uuid.uuid4()), "secret_fields": ["token", "link"]}
    data = {"email": "a@example.com", "token": "legacy-token", "link": None, "expires_at": "x"}
    enqueue(db, to="a@example.com", template="verify-email", data=data, metadata=legacy)
    (sent,) = (await deliver(db, async_engine)).sent
    assert token_in(sent) == "legacy-token"


def test_a_reference_names_its_send_and_the_link_keeps_the_callers_query():
    vid = uuid.uuid4()
    reference = EmailReference(vid, 3, REDIRECT)
    assert EmailReference.from_metadata(reference.metadata()) == reference
    derive = Tokens(b"k" * 32)
    secrets = reference.secrets(derive.token(vid, 3))
    assert secrets["link"] == f"{REDIRECT}&verification_id={vid}&token={secrets['token']}"
    assert len(secrets["token"] or "") == 43 and derive.token(vid, 3) != derive.token(vid, 4)
    assert Tokens(b"j" * 32).token(vid, 3) != secrets["token"]  # another key, another token
    assert EmailReference(vid, 1, None).secrets("t") == {"token": "t", "link": None}
    assert "k" * 32 not in repr(derive)  # the key never reaches a log line
