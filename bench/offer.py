"""Enqueue at a steady rate, one message per transaction, the way an application would:
several request threads, each committing its own transaction.

    python -m bench.offer DATABASE_URL PER_SECOND TOTAL COMMITS_FILE

Each committed message is noted as "<id> <unix time of the commit>" in COMMITS_FILE, so
latency can be measured from the moment the application's transaction committed.
"""

from __future__ import annotations

import sys
import threading
import time

from mailbag.services.intake import enqueue
from mailbag.store.database import make_engine

THREADS = 16  # a commit waits for its fsync; requests in parallel share the flushes


def main() -> None:
    url, rate, total, commits_file = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    engine = make_engine(url, pool_size=THREADS)
    started = time.perf_counter() + 0.2
    committed: list[tuple[str, float]] = []

    def request_thread(first: int) -> None:
        for i in range(first, total, THREADS):
            pause = started + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            with engine.begin() as conn:
                result = enqueue(
                    conn, to=f"user{i}@example.com", template="welcome", data={"name": "Ada"}
                )
            committed.append((str(result.message.id), time.time()))

    threads = [threading.Thread(target=request_thread, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine.dispose()
    with open(commits_file, "w") as out:
        out.writelines(f"{message_id} {at:.6f}\n" for message_id, at in committed)


if __name__ == "__main__":
    main()
