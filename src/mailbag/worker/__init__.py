"""The dispatcher: sweep -> claim -> render -> send -> finalize, safe with any number of replicas.

One asyncio task runs the loop (loop.py); each claimed chunk is sent by its own task (at
most CONCURRENCY emails are claimed and undecided at once); decisions are written in
batches by one writer task, and a keeper task extends the leases of everything held. No
database transaction is ever open while a provider call is in flight.

The parts, one concern each:
- loop.py `Worker`: sweep, claim, dispatch, wait; drain at the end;
- ledger.py `Ledger`: what is held (claimed -> sending -> decided -> written), free slots;
- attempt.py `Sender.attempt`: compose, send, classify, decide one chunk (no database);
- writer.py `OutcomeWriter`: batched writes of decisions, database backoff, drain on exit;
- leases.py `LeaseKeeper`: extends the leases of everything held while entered;
- supervisor.py `SideTasks`: the side tasks, started in one place; one that ends halts;
- database.py `WorkerDatabase`: every database call the worker makes;
- report.py `Report`: stats, metrics and the per-message log lines of what was written;
- failures.py: DB_ERRORS, Backoff, WorkerFailed; config.py: WorkerConfig, PeriodicJob.

Failure handling, in short:
- a database error anywhere backs the loop off (1 s doubling to 30 s) and it resumes;
  outcomes that could not be written are kept and written when the database is back. A
  database that does not answer within DATABASE_TIMEOUT_SECONDS counts as an error;
- the side tasks (writer, lease keeper, listener, periodic jobs) run as long as the
  worker does. If one dies (a bug, not a database error), the worker stops as on SIGTERM
  (drains, writes what it can, releases what it had not started, stops renewing leases)
  and `run` raises WorkerFailed, so the process exits non-zero and its supervisor
  restarts it: never a half-alive worker whose leases outlive its writer;
- a provider that reports itself disabled gets its messages released (no attempt spent)
  and the whole worker pauses claiming for a while;
- a claimed message whose expires_at has come is finalized `expired` (Action.LAPSE),
  never sent, and frees its slot like any decided message;
- SIGTERM/SIGINT: stop claiming, let sends in flight finish within the grace period,
  finalize them, release what had not started, and return.
"""

from mailbag.worker.config import PeriodicJob, WorkerConfig
from mailbag.worker.failures import WorkerFailed
from mailbag.worker.loop import Worker

__all__ = ["PeriodicJob", "Worker", "WorkerConfig", "WorkerFailed"]
