"""`mailbag send-bulk`: one message per CSV row (issue 12)."""

from __future__ import annotations


def send_bulk() -> None:
    """Send one templated message per row of a CSV file."""
