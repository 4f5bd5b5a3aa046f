"""Run the peers: `python -m bench.peers.run --jobs 20000 --workers 1 4 [--out FILE]`.

Prints a JSON list of PeerResult dicts (and writes it to --out). Runs one after another,
never side by side: on a small machine they would only measure each other.
Servers: BENCH_POSTGRES_URL (else MAILBAG_TEST_POSTGRES_URL, else
postgresql://postgres@127.0.0.1:5432/test) and BENCH_REDIS_URL (redis://127.0.0.1:6379/13).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.peers import celery_peer, pgqueuer_peer, procrastinate_peer
from bench.peers.common import PeerResult

PEERS: dict[str, Callable[..., PeerResult]] = {
    "procrastinate": procrastinate_peer.run,
    "pgqueuer": pgqueuer_peer.run,
    "celery": celery_peer.run,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.run", description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1, 4], help="worker process counts"
    )
    parser.add_argument(
        "--peers", nargs="+", choices=sorted(PEERS), default=list(PEERS), help="which peers"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--out", type=Path, help="also write the JSON list here")
    args = parser.parse_args(argv)

    results = []
    for name in args.peers:
        for workers in args.workers:
            print(f"{name}: {args.jobs} jobs, {workers} worker(s)...", file=sys.stderr)
            result = PEERS[name](args.jobs, workers, timeout=args.timeout)
            print(f"  {result.per_second:.1f} jobs/s in {result.seconds:.2f} s", file=sys.stderr)
            results.append(result.as_dict())

    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    # A throughput with lost or repeated jobs is not a result: make it fail loudly.
    flawed = [r for r in results if r["missing"] or r["duplicates"]]
    for r in flawed:
        print(f"{r['peer']} x{r['workers']}: {r['missing']} missing, "
              f"{r['duplicates']} duplicates", file=sys.stderr)  # fmt: skip
    return 1 if flawed else 0


if __name__ == "__main__":
    raise SystemExit(main())
