"""The signing benchmark runs, and measures what it says: a signed build costs more than an
unsigned one, and each run's ratios are of its own figures."""

from __future__ import annotations

from bench import dkim_sign


def test_the_signing_benchmark_runs_quick() -> None:
    summary = dkim_sign.run(n=3, runs=2)
    assert len(summary["runs"]) == 2
    for name in ("rsa", "ed25519"):
        ratio = summary[name]["ratio_to_unsigned"]
        assert ratio["range"][0] <= ratio["median"] <= ratio["range"][1]
        assert summary[name]["median_us"] > summary["unsigned"]["median_us"]
