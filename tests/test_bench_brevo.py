"""The Brevo batch benchmark runs end to end at its quick size (no rate is asserted), and
its Brevo stand-in refuses what Brevo's spec says Brevo refuses.

The end-to-end run needs PostgreSQL (MAILBAG_TEST_POSTGRES_URL); without one it is
skipped, except when CI=true: then it fails.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from bench import brevo_batch, common
from bench.brevo_fake import Invalid, validate
from bench.peers.common import postgres_problem

from conftest import IN_CI


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_brevo_batch_benchmark_runs_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    url = os.environ.get("MAILBAG_TEST_POSTGRES_URL", "")
    problem = postgres_problem(url) if url else "MAILBAG_TEST_POSTGRES_URL not set"
    if problem is not None:
        if IN_CI:
            pytest.fail(f"CI=true: {problem}")
        pytest.skip(problem)
    monkeypatch.setattr(common, "PG_BASE", url)  # where its scratch database is made

    (row,) = brevo_batch.run(quick=True)
    assert row["versions_per_call"] == row["ceiling_versions_per_call"] == 1000
    assert row["kib_per_call"] == row["ceiling_kib_per_call"]
    assert (row["duplicates"], row["missing"]) == (0, 0)
    assert (row["ceiling_duplicates"], row["ceiling_missing"]) == (0, 0)
    assert row["per_second"] > 0 and row["ceiling_per_second"] > 0 and row["ratio"] > 0


def _batch(versions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "sender": {"email": "bench@example.com", "name": "mailbag"},
        "subject": "Hello",
        "htmlContent": "<p>Hello</p>",
        "messageVersions": versions,
    }


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (_batch([]), "1 to 1000"),
        (_batch([{"to": [{"email": f"u{i}@example.com"}]} for i in range(1001)]), "1 to 1000"),
        (_batch([{"to": [{"email": f"u{j}@example.com"} for j in range(99)]}] * 21), "2000"),
        (_batch([{"to": [{"email": f"u{j}@example.com"} for j in range(100)]}]), "99"),
        (_batch([{"to": [{"email": "mailbag@localhost"}]}]), "email is not valid"),
        (_batch([{"to": [{"email": "a@example.com", "name": "x" * 71}]}]), "70"),
        (_batch([{"to": []}]), "missing or empty"),
        (_batch([{"to": [{"email": "a@example.com"}], "headers": {}}]), "unknown"),
        ({**_batch([{"to": [{"email": "a@example.com"}]}]), "to": []}, "must not be passed"),
        ({**_batch([{"to": [{"email": "a@example.com"}]}]), "htmlContent": ""}, "missing"),
    ],
)
def test_the_stand_in_refuses_what_brevo_refuses(body: dict[str, object], reason: str) -> None:
    with pytest.raises(Invalid, match=reason):
        validate(body)


def test_the_stand_in_takes_a_batch_as_its_versions() -> None:
    versions = [{"to": [{"email": f"u{i}@example.com"}], "textContent": "hi"} for i in range(3)]
    assert validate(_batch(versions)) == versions
