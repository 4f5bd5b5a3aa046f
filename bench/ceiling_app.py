"""The HTTP API's ceiling: the least a request can do on mailbag's own stack.

FastAPI + pydantic + SQLAlchemy async (Core) + psycopg + uvicorn, with the uvicorn options
`mailbag api` uses (one process, no access log, log level warning): a pydantic body like
`POST /v1/messages`'s, one INSERT of a comparable row (uuid, tenant, Idempotency-Key,
recipient, template, JSON data, timestamps) into its own table in autocommit, and a JSON
answer made by orjson. The engine is SQLAlchemy's own with its defaults (create_async_engine
of the URL: psycopg prepares a statement run five times, no timeouts set per connection),
not mailbag's. No authentication, no idempotency check, no history row: what mailbag adds
over this is what its guarantees cost (issue 27 asked for this leaner yardstick: the
earlier one ran the INSERT in a transaction through mailbag's engine).

    CEILING_DATABASE_URL=postgresql://... python -m bench.ceiling_app --port 8001
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import FastAPI, Header, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import JSON, Column, DateTime, MetaData, String, Table, Uuid, insert
from sqlalchemy.ext.asyncio import create_async_engine

from mailbag.store.database import async_url

metadata = MetaData()
ceiling_messages = Table(
    "ceiling_messages",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("tenant_id", String(64), nullable=False),
    Column("idempotency_key", String(255)),
    Column("to_address", String(320), nullable=False),
    Column("template_name", String(200)),
    Column("template_data", JSON, nullable=False),
    Column("status", String(20), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
)


class MessageIn(BaseModel):
    """The part of mailbag's MessageCreate a benchmark request uses."""

    model_config = ConfigDict(extra="forbid")
    to: str = Field(max_length=320)
    template: str | None = Field(None, max_length=200)
    data: dict[str, Any] = Field(default_factory=dict)
    subject: str | None = Field(None, max_length=998)
    tags: list[str] = Field(default_factory=list)


def create_app(database_url: str) -> FastAPI:
    engine = create_async_engine(async_url(database_url))
    adding = insert(ceiling_messages)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
        yield
        await engine.dispose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/messages", status_code=201)
    async def create(body: MessageIn, idempotency_key: str | None = Header(None)) -> Response:
        now = datetime.now(UTC)
        row = {
            "id": uuid.uuid4(),
            "tenant_id": "bench",
            "idempotency_key": idempotency_key,
            "to_address": body.to,
            "template_name": body.template,
            "template_data": body.data,
            "status": "pending",
            "created_at": now,
            "next_attempt_at": now,
        }
        async with engine.connect() as conn:
            await (await conn.execution_options(isolation_level="AUTOCOMMIT")).execute(adding, row)
        answer = {
            "id": row["id"],
            "status": "pending",
            "to": body.to,
            "template": body.template,
            "data": body.data,
            "created_at": now,
        }
        return Response(orjson.dumps(answer), 201, media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = create_app(os.environ["CEILING_DATABASE_URL"])
    # The options of mailbag.runtime.uvicorn_options, one process.
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
