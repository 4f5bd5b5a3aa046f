"""PNG plots of the scaling results, written beside docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def draw(results: dict[str, list[dict[str, Any]]], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if results.get("dispatch"):
        _lines(
            [r for r in results["dispatch"] if r.get("provider") == "sink"],
            x="workers",
            y="per_second",
            by="database",
            title="Dispatch throughput, instant provider",
            xlabel="worker processes",
            ylabel="messages / s",
            path=folder / "bench-dispatch.png",
        )
    if results.get("slow"):
        _lines(
            results["slow"],
            x="concurrency",
            y="per_second",
            by="database",
            title="One worker, provider taking 100 ms per send",
            xlabel="CONCURRENCY",
            ylabel="messages / s",
            path=folder / "bench-slow-provider.png",
            logx=True,
        )
    if results.get("scale"):
        figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for kind in sorted({r["database"] for r in results["scale"]}):
            rows = [r for r in results["scale"] if r["database"] == kind]
            left.plot(
                [r["rows"] for r in rows], [r["claim_p50_ms"] for r in rows], "o-", label=kind
            )
            right.plot(
                [r["rows"] for r in rows],
                [r["worker_peak_rss_mib"] for r in rows],
                "o-",
                label=kind,
            )
        for axis, label in ((left, "claim of 100, median ms"), (right, "worker peak RSS, MiB")):
            axis.set_xscale("log")
            axis.set_xlabel("rows in outbox_messages")
            axis.set_ylabel(label)
            axis.set_ylim(bottom=0)
            axis.grid(True, alpha=0.3)
            axis.legend()
        figure.suptitle("Cost as the table grows (1,000 due rows each time)")
        figure.tight_layout()
        figure.savefig(folder / "bench-scale.png", dpi=110)
        plt.close(figure)


def _lines(
    rows: list[dict[str, Any]],
    *,
    x: str,
    y: str,
    by: str,
    title: str,
    xlabel: str,
    ylabel: str,
    path: Path,
    logx: bool = False,
) -> None:
    figure, axis = plt.subplots(figsize=(6, 4))
    for group in sorted({r[by] for r in rows}):
        points = sorted((r[x], r[y]) for r in rows if r[by] == group)
        axis.plot([p[0] for p in points], [p[1] for p in points], "o-", label=group)
    if logx:
        axis.set_xscale("log", base=2)
    axis.set_title(title)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
