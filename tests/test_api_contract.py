"""The API against its own OpenAPI document: schemathesis over real HTTP, no 5xx, every
response (status, content type, body, headers) as documented."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from api_helpers import settings_for
from mailbag.api import create_app
from mailbag.services.tenants import create_tenant
from mailbag.store import migrate
from mailbag.store.database import make_engine
from servers import uvicorn_thread

EXAMPLES_PER_OPERATION = 30


class SqliteDB:
    def __init__(self, path: Path) -> None:
        self.url = f"sqlite:///{path}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    db = SqliteDB(tmp_path_factory.mktemp("contract") / "contract.db")
    engine = make_engine(db.url)
    migrate.upgrade(engine)
    _, key = create_tenant(engine, "contract")
    engine.dispose()
    with uvicorn_thread(create_app(settings_for(db))) as base:
        yield base, key


def operations(base: str) -> list[schemathesis.APIOperation]:
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def test_every_operation_keeps_its_contract(served: tuple[str, str]) -> None:
    base, key = served
    checked = []
    for operation in operations(base):

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def keeps_contract(case: schemathesis.Case) -> None:
            case.call_and_validate(
                base_url=base,
                headers={"Authorization": f"Bearer {key}"},
                # Addresses and template names are checked beyond what JSON Schema can say
                # (email-validator, the template catalog): a schema-valid body may be a 422.
                excluded_checks=[positive_data_acceptance],
            )

        keeps_contract()
        checked.append(operation.label)
    assert "POST /v1/email-verifications" in checked and len(checked) >= 8
