"""Idempotency records: per (tenant, Idempotency-Key) the fingerprint of the request that
first used the key and the response it got, written in the same transaction as the
resource. The unique index on (tenant, key) decides races: the loser's INSERT fails (after
waiting for the winner to commit) and it replays the winner's record instead.

The response body is kept as its JSON text (a JSON string in the column), not as a JSON
object: PostgreSQL's JSONB reorders object keys and rewrites numbers (1e20 comes back as an
integer), and a replay must render to exactly the bytes of the first answer. Records
written before that hold an object and still replay."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import delete, insert, select, update

from mailbag.store.plan import Plan, Step
from mailbag.store.schema import idempotency_records as records


class Claim(TypedDict):
    """What a record holds a key with (take_key, complete_record): the tenant's key, the
    operation and request fingerprint that first used it, when, and until when."""

    tenant_id: str
    key: str
    operation: str
    fingerprint: str
    now: datetime
    expires_at: datetime


@dataclass(frozen=True)
class Record:
    id: int
    operation: str
    fingerprint: str
    resource_id: str | None
    response_status: int | None
    response_body: Any
    expires_at: datetime


def find(tenant_id: str, key: str) -> Plan[Record | None]:
    query = select(records).where(
        records.c.tenant_id == tenant_id, records.c.idempotency_key == key
    )
    row = (yield Step(query)).first()
    if row is None:
        return None
    return Record(
        row.id,
        row.operation,
        row.fingerprint,
        row.resource_id,
        row.response_status,
        _body(row.response_body),
        row.expires_at,
    )


def drop_if_expired(tenant_id: str, key: str, now: datetime) -> Plan[bool]:
    """An expired record no longer holds its key: remove it so the key can be used again."""
    result = yield Step(
        delete(records).where(
            records.c.tenant_id == tenant_id,
            records.c.idempotency_key == key,
            records.c.expires_at <= now,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def take_key(**claim: Unpack[Claim]) -> Plan[None]:
    """Claim the key; raises IntegrityError when another request holds it."""
    yield Step(insert(records).values(_taken(claim)))


def record_response(
    *, tenant_id: str, key: str, resource_id: str | None, status: int, body: Any
) -> Plan[None]:
    yield Step(
        update(records)
        .where(
            records.c.tenant_id == tenant_id,
            records.c.idempotency_key == key,
        )
        .values(resource_id=resource_id, response_status=status, response_body=_text(body))
    )


def complete_record(
    *, resource_id: str | None, status: int, body: Any, **claim: Unpack[Claim]
) -> dict[str, Any]:
    """A record taken and answered at once (store.enqueue.enqueue_first_use writes it in the
    statement that does the work): what take_key and record_response write together."""
    return {
        **_taken(claim),
        "resource_id": resource_id,
        "response_status": status,
        "response_body": _text(body),
    }


def _taken(claim: Claim) -> dict[str, Any]:
    """The columns of a record that holds a key (take_key), before its answer is known."""
    return {
        "tenant_id": claim["tenant_id"],
        "idempotency_key": claim["key"],
        "operation": claim["operation"],
        "fingerprint": claim["fingerprint"],
        "created_at": claim["now"],
        "expires_at": claim["expires_at"],
    }


def _text(body: Any) -> str:
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _body(stored: Any) -> Any:
    # A str is the body's text; anything else is a record from before bodies were kept so.
    return json.loads(stored) if isinstance(stored, str) else stored


def purge_expired(now: datetime, limit: int = 1000) -> Plan[int]:
    ids = (
        (yield Step(select(records.c.id).where(records.c.expires_at <= now).limit(limit)))
        .scalars()
        .all()
    )
    if not ids:
        return 0
    result = yield Step(delete(records).where(records.c.id.in_(ids)))
    return int(result.rowcount)  # type: ignore[attr-defined]
