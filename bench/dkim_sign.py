"""What signing costs a message (issue 25): `python3 -m bench.dkim_sign [--runs 5 --n 300]`.

The same email (a subject, HTML and text parts, List-Unsubscribe) is built as the bytes a
provider sends (`OutgoingEmail.raw`), unsigned, then signed with an RSA 2048 key and with
an Ed25519 key (dkimpy, as the worker signs). CPU time per message (process time, one
thread), each run `--n` emails, `--runs` runs; the median and the range of each, and the
ratio of each signed figure to the unsigned one of the same run. Results:
bench/results/dkim_sign.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from bench.common import ROOT
from mailbag.compose import OutgoingEmail
from mailbag.domain import dkim
from mailbag.domain.content import Address, Recipients
from mailbag.domain.dkim import Algorithm, SigningKey

RESULTS = ROOT / "bench" / "results" / "dkim_sign.json"
HTML = "<h1>Your invoice</h1>" + "<p>Thank you for your order, it ships today.</p>" * 40


def email(i: int, key: SigningKey | None) -> OutgoingEmail:
    return OutgoingEmail(
        message_id=uuid.UUID(int=i + 1),
        attempt=1,
        tenant_id="default",
        from_email="billing@example.com",
        from_name="Billing",
        recipients=Recipients(to=(Address(f"ada{i}@example.org", "Ada"),)),
        subject="Your invoice",
        html=HTML,
        text="Thank you for your order, it ships today.\n" * 40,
        rfc_message_id=f"<{i}@example.com>",
        date=datetime(2026, 12, 2, tzinfo=UTC),
        unsubscribe_url="https://example.com/u/1",
        dkim=key,
    )


def per_message_us(n: int, key: SigningKey | None) -> float:
    started = time.process_time()
    for i in range(n):
        email(i, key).raw  # noqa: B018 - building (and signing) is what is measured
    return (time.process_time() - started) / n * 1e6


def run(n: int, runs: int) -> dict[str, Any]:
    keys = {
        algorithm.value: SigningKey(
            "example.com", "s1", algorithm, dkim.generate(algorithm).private
        )
        for algorithm in Algorithm
    }
    rows: list[dict[str, float]] = []
    for _ in range(runs):
        row = {"unsigned": per_message_us(n, None)}
        row |= {name: per_message_us(n, key) for name, key in keys.items()}
        rows.append(row)
    summary: dict[str, Any] = {"n": n, "runs": rows}
    for name in ("unsigned", *keys):
        values = [r[name] for r in rows]
        summary[name] = {
            "median_us": statistics.median(values),
            "range_us": [min(values), max(values)],
        }
        if name != "unsigned":
            ratios = [r[name] / r["unsigned"] for r in rows]
            summary[name]["ratio_to_unsigned"] = {
                "median": statistics.median(ratios),
                "range": [min(ratios), max(ratios)],
            }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    summary = run(args.n, args.runs)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    for name in ("unsigned", "rsa", "ed25519"):
        part = summary[name]
        ratio = part.get("ratio_to_unsigned")
        extra = f", {ratio['median']:.1f}x unsigned" if ratio else ""
        print(f"{name}: {part['median_us']:.0f} µs a message{extra}")


if __name__ == "__main__":
    main()
