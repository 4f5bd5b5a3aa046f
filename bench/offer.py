"""Enqueue at a steady rate, one message per transaction, the way an application would.

python -m bench.offer DATABASE_URL PER_SECOND TOTAL
"""

from __future__ import annotations

import sys
import time

from mailbag.services.outbox import enqueue
from mailbag.store.database import make_engine


def main() -> None:
    url, rate, total = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    engine = make_engine(url, pool_size=2)
    started = time.perf_counter()
    for i in range(total):
        due = started + i / rate
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        with engine.begin() as conn:
            enqueue(conn, to=f"user{i}@example.com", template="welcome", data={"name": "Ada"})
    engine.dispose()


if __name__ == "__main__":
    main()
