-- enqueue.enqueue_first_use (mysql)
-- PostgreSQL only: write `record` (an idempotency_records row, response included), the message
-- `row` and its history row in one statement, atomic by itself (run it in autocommit). False:
-- it wrote nothing; raises IntegrityError (the session's Conflict), having written nothing,
-- when a message without a record holds the key. Either way the caller takes the readable
-- path.
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- no SQL
