-- console_sessions.end (postgresql)
-- Written by `python -m mailbag.store.sqldocs` from the plan; do not edit.

-- step 1
DELETE FROM console_sessions WHERE console_sessions.id_digest = :id_digest_1::VARCHAR;
