"""The SMTP wire benchmark runs end to end at a tiny size (no timing is asserted)."""

from __future__ import annotations

import os

import pytest

from bench import smtp_wire


@pytest.mark.slow
def test_mailbag_and_smtp_source_fill_the_same_sink_without_loss() -> None:
    reason = smtp_wire.available()
    if reason and not os.environ.get("CI"):
        pytest.skip(reason)
    rows = smtp_wire.run(quick=True)
    measured = [row for row in rows if "round" in row]
    assert measured, "no round ran"
    for row in measured:
        assert (row["duplicates"], row["missing"], row["smtp_source_missing"]) == (0, 0, 0)
        assert row["mailbag_per_second"] > 0 and row["smtp_source_per_second"] > 0
        assert row["ratio"] > 0 and row["message_bytes"] > 0
