"""The send-rate chart as plain SVG geometry: drawn on the server, no charting script."""

from __future__ import annotations

from dataclasses import dataclass

WIDTH = 600
HEIGHT = 160
AXIS = 20  # room under the bars for the time labels
TOP = 16  # room over the tallest bar for its count
GAP = 4


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    value: int
    label: str  # which five minutes, for the tooltip


@dataclass(frozen=True)
class Chart:
    bars: list[Bar]
    total: int
    peak: int
    width: int = WIDTH
    height: int = HEIGHT
    baseline: int = HEIGHT - AXIS

    @property
    def summary(self) -> str:
        counts = ", ".join(str(b.value) for b in self.bars)
        return f"Emails sent per 5 minutes over the last hour, oldest first: {counts}"


def sent_chart(per_bucket: list[int], minutes_per_bucket: int = 5) -> Chart:
    """Bars oldest first; heights relative to the busiest bucket (an empty hour draws none)."""
    n = max(len(per_bucket), 1)
    slot = WIDTH / n
    peak = max(per_bucket, default=0)
    usable = HEIGHT - AXIS - TOP
    bars = []
    for i, value in enumerate(per_bucket):
        height = usable * value / peak if peak else 0.0
        ago = (n - i) * minutes_per_bucket
        bars.append(
            Bar(
                x=i * slot + GAP / 2,
                y=HEIGHT - AXIS - height,
                width=slot - GAP,
                height=height,
                value=value,
                label=f"{ago} to {ago - minutes_per_bucket} minutes ago: {value} sent",
            )
        )
    return Chart(bars=bars, total=sum(per_bucket), peak=peak)
