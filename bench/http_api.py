"""Placeholder: filled in by issue 13's work (see /work/notes/issue13.md)."""

from __future__ import annotations

from typing import Any


def run(quick: bool) -> list[dict[str, Any]]:
    """Every row of this section's measurement, side by side with its ceiling or peer."""
    return []
